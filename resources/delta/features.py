"""What a table may have turned on that exactly's commits cannot honour.

delta-spark reads and maintains the tables exactly commits, so an operator can set a table
property there under a live pipeline. Most features delta-rs cannot write it refuses on its
own, at the commit (as a lost race, or an error that looks like the store failing); one it
commits through, silently wrong: column mapping. exactly adds a batch's files as Spark
staged them, with the columns' names; once a column is mapped to another physical name
(a rename, or a drop and re-add), delta-spark reads those files' values of it as nulls, and
delta-rs reads the older rows' as nulls. CHECK constraints are the other silent case: a
batch's rows are added as staged, never checked against the table's constraints, which
every reader then trusts.

So before the vote (the batch is abandoned, its offsets read again once the table is
fixed) and again at the commit (a batch that voted before the change waits, voted), a table
is refused, in one line naming what to turn off, when it has:
- column mapping on (`delta.columnMapping.mode` other than `none`);
- CHECK constraints (`delta.constraints.*`);
- a reader or writer feature outside `WRITABLE`: the ones exactly's own tables carry, the
  ones those two leave in the protocol once turned off (features are never removed), and
  change data feed (appends need nothing more of a writer).

A replace is the one commit change data feed does not take (`replace_refusal`): it
rewrites each file holding a replaced row without it, delta-rs writes no change data for
that commit, and a change-feed reader then derives the commit's changes from its files:
every other row of a rewritten file reads as deleted and inserted again (a 10-row replace
of a 100-row file: 100 deletes and 100 inserts), a second copy for anyone who applies the
inserts. So a replace is refused when it is planned (BackfillError) and, for one that voted
before the feed was turned on, at its commit (InconsistencyError: it waits, voted).
"""

from __future__ import annotations

from deltalake import DeltaTable

from ledger.core.errors import InconsistencyError, RefusedBatchError

#: Table features exactly writes correctly (see the module docstring for why each).
WRITABLE = frozenset(
    {
        "appendOnly",
        "invariants",
        "timestampNtz",
        "generatedColumns",
        "changeDataFeed",
        "columnMapping",  # refused while its mode is on, below
        "checkConstraints",  # refused while a constraint is set, below
    }
)


def unwritable(table: DeltaTable) -> str | None:
    """What in `table` exactly cannot honour, in words, or None."""
    configuration = table.metadata().configuration
    mode = configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        return (
            f"column mapping (delta.columnMapping.mode = {mode}): a batch's files name "
            "their columns as staged, and a column mapped to another physical name would "
            "read as nulls"
        )
    constraints = sorted(k for k in configuration if k.startswith("delta.constraints."))
    if constraints:
        return (
            f"CHECK constraints ({', '.join(constraints)}), which exactly does not check a "
            "batch's rows against"
        )
    protocol = table.protocol()
    features = {*(protocol.reader_features or ()), *(protocol.writer_features or ())}
    others = sorted(features - WRITABLE)
    if others:
        return f"table features exactly does not write ({', '.join(others)})"
    return None


def unwritable_sentence(uri: str, reason: str) -> str:
    """The one line that refuses a table for `reason`."""
    return (
        f"Delta table {uri} uses {reason}; nothing was committed: turn it off (delta-spark "
        "ALTER TABLE ... UNSET/SET TBLPROPERTIES), or point the pipeline at another table"
    )


def replace_refusal(table: DeltaTable, uri: str) -> str | None:
    """Why a replace cannot commit into `table` (at `uri`) as it is, in one sentence, or
    None: change data feed on (see the module docstring)."""
    flag = table.metadata().configuration.get("delta.enableChangeDataFeed", "false")
    if flag.strip().lower() != "true":
        return None
    return (
        f"Delta table {uri} has change data feed on (delta.enableChangeDataFeed): a replace "
        "rewrites the files holding the rows it replaces and delta-rs writes no change data "
        "for them, so a change-feed reader would see every other row of those files deleted "
        "and inserted again; turn it off for the replace (delta-spark ALTER TABLE ... SET "
        "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false'); readers then cannot read "
        "changes across it, rather than read wrong ones)"
    )


def refuse_replace(table: DeltaTable, uri: str) -> None:
    """At a voted replace's commit: InconsistencyError (the batch waits, voted) if
    `replace_refusal` refuses `table`."""
    reason = replace_refusal(table, uri)
    if reason is not None:
        raise InconsistencyError(
            f"{reason}; nothing was committed: the replace voted before the feed was turned "
            "on, so it waits, voted: recover it once the feed is off"
        )


def refuse_unwritable(table: DeltaTable, uri: str, *, voted: bool) -> None:
    """Refuse `table` (at `uri`) if it has what exactly cannot honour: before the vote a
    RefusedBatchError, which abandons the batch; after it an InconsistencyError, which
    leaves the voted batch waiting until the table is fixed and the batch recovered."""
    reason = unwritable(table)
    if reason is None:
        return
    sentence = unwritable_sentence(uri, reason)
    if voted:
        raise InconsistencyError(
            f"{sentence}; the batch voted before the table changed, so it waits, voted: "
            "recover it once the table is fixed"
        )
    raise RefusedBatchError(sentence)

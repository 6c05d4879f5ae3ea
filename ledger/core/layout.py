"""The storage layout every job agrees on: the coordinate columns of a row, the outputs a
batch is voted and published to, and where an attempt stages its files.

One module because the agreement is the protocol's, not any one job's: the stage writes
what the publisher commits, the derived outputs and the table's replace find rows by the
same coordinate columns, and the cleaner may delete only what lies in the folders the
stage writes (invariant 18): a folder named one way by the stage and another by the
cleaner would be invisible to it, or worse. Pure names and paths, '/'-separated and
relative to a table's root; joining them to a table's location is the storage's.
"""

from __future__ import annotations

# -- the coordinate columns: where a row was read from, and by which batch ------------------

TOPIC = "_kafka_topic"
PARTITION = "_kafka_partition"
OFFSET = "_kafka_offset"
TIMESTAMP = "_kafka_timestamp"
BATCH_ID = "_batch_id"
#: What every row of the table and the quarantine carries (a transform must keep them).
COORDINATES = (TOPIC, PARTITION, OFFSET, TIMESTAMP, BATCH_ID)
#: What names one Kafka record: distinct across the records a batch reads (invariant 13).
KEY = (TOPIC, PARTITION, OFFSET)

# -- the outputs: a voted file's target, the keys of a batch's schemas ----------------------

TABLE, QUARANTINE = "table", "quarantine"
#: A derived output's target is `derived:<name>`. Its files are partials (groups, latest
#: records), not records.
DERIVED_PREFIX = "derived:"


def derived_target(name: str) -> str:
    """The vote's target for derived output `name`."""
    return f"{DERIVED_PREFIX}{name}"


def is_derived(target: str) -> bool:
    return target.startswith(DERIVED_PREFIX)


# -- the staged folders: where attempts write, below each output's root ----------------------

#: The column that routes each row to its output in the stage's one write, and so the folder
#: below the table's attempt folder that holds each output's rows (`exactly_output=table/`,
#: `=quarantine/`). Not `_`-prefixed: Delta's VACUUM treats such folders as hidden.
ROUTE = "exactly_output"

#: The folder under every output's root below which attempts write, one folder per
#: application id. Not `_`-prefixed, so Delta's VACUUM cleans orphans of abandoned attempts.
STAGED = "staged"


def staged_path(app_id: str) -> str:
    """Where every attempt of `app_id` writes its folder, below an output's root."""
    return f"{STAGED}/{app_id}"


def attempt_path(app_id: str, batch_id: int, attempt: int, token: str) -> str:
    """The folder of one attempt, below an output's root: unique to the attempt.

    The attempt's token is part of the name: after a lost ledger is rebuilt, batch ids and
    attempt numbers start over where the ledger stopped, and the folder of a batch the old
    ledger planned may still be there; a stage never writes into a folder that exists
    (invariant 4).
    """
    return f"{staged_path(app_id)}/batch-{batch_id:012d}-attempt-{attempt}-{token}"


def attempt_folder_of(path: str, app_id: str) -> str | None:
    """The attempt folder (below the output's root) that holds the file at `path` (below the
    same root, '/'-separated), when `path` lies in `app_id`'s staged folder; else None.

    The attempt folder is the one directly below the staged folder, whatever its name: the
    unit the cleaner deletes whole or keeps whole.
    """
    prefix = f"{staged_path(app_id)}/"
    if not path.startswith(prefix) or len(path) == len(prefix):
        return None
    return prefix + path[len(prefix) :].split("/", 1)[0]

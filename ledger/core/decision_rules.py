"""What an operator may decide (pure): the rules each `exactly skip` kind is checked by
before it is recorded (ledger/core/decisions.py holds the decisions themselves and what they
do to positions; ledger/coordinator/decisions.py records one). Each rule refuses, in one
line naming the partition or the topic, what would lose or re-read records without the
operator saying so (`force`), and names the command that fits instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ledger.core.errors import CONFIG_PLACEHOLDER, DecisionError
from ledger.core.protocol import Available, OffsetRange, Positions


def _skip_command(kind: str, args: str) -> str:
    return f"exactly skip {kind} -c {CONFIG_PLACEHOLDER} {args} --reason '...'"


def retire_topic_command(topic: str) -> str:
    """The decision that lets a pipeline on several topics go on without `topic`."""
    return _skip_command("retire-topic", f"--topic {topic}")


def _same_topic(topic: str, positions: Positions, current_id: str) -> None:
    if positions.topic_id is not None and positions.topic_id != current_id:
        raise DecisionError(
            f"topic {topic} has id {current_id}, but the positions belong to id "
            f"{positions.topic_id}: accept the new topic first: "
            f"{_skip_command('new-topic', f'--topic-id {current_id}')}"
        )


def lost_offsets_skips(
    topic: str,
    positions: Positions,
    available: Mapping[int, Available],
    current_id: str,
    *,
    partition: int | None = None,
    to: int | None = None,
    force: bool = False,
) -> list[OffsetRange]:
    """The ranges a `lost-offsets` decision skips: [position, earliest) of each partition
    whose position retention deleted (all of them, or `partition`).

    Refuses what is not a loss: a partition whose position Kafka still holds, an end below
    the earliest offset (that would leave part of the loss in place), and, unless `force`,
    an end past it (that would skip records Kafka still holds: the careless operator's
    silent loss). Never past the last stable offset.
    """
    _same_topic(topic, positions, current_id)
    if partition is not None and partition not in available:
        raise DecisionError(f"{topic}-{partition}: no such partition in Kafka")
    wanted = [partition] if partition is not None else sorted(available)
    skips = []
    for p in wanted:
        avail = available[p]
        stored = positions.get(p)
        if stored is None or stored >= avail.earliest:
            if partition is None:
                continue
            where = (
                "it has no position yet and starts at its earliest offset on its own"
                if stored is None
                else f"its position {stored} is still in Kafka (earliest is {avail.earliest})"
            )
            raise DecisionError(f"{topic}-{p}: nothing is lost, so nothing to skip: {where}")
        end = avail.earliest if to is None else to
        if end < avail.earliest:
            raise DecisionError(
                f"{topic}-{p}: --to {end} would leave offsets [{end}, {avail.earliest}) lost "
                f"too; the lost range is [{stored}, {avail.earliest}): leave out --to"
            )
        if end > avail.last_stable:
            raise DecisionError(
                f"{topic}-{p}: --to {end} is past the last stable offset {avail.last_stable}"
            )
        if end > avail.earliest and not force:
            raise DecisionError(
                f"{topic}-{p}: skipping to {end} would also skip offsets "
                f"[{avail.earliest}, {end}) that Kafka still holds; only [{stored}, "
                f"{avail.earliest}) is lost (leave out --to), or add --force to drop those "
                "records on purpose"
            )
        skips.append(OffsetRange(topic, p, stored, end))
    if not skips:
        raise DecisionError(
            f"topic {topic}: nothing is lost: every partition's position is still in Kafka"
        )
    return skips


def check_new_topic(
    topic: str,
    positions: Positions,
    current_id: str,
    accepted_id: str,
    *,
    read_before: Iterable[str] = (),
    force: bool = False,
    upsert_outputs: Sequence[str] = (),
) -> None:
    """A `new-topic` decision accepts the id Kafka reports now, and only when the positions
    belong to another one: the operator names the id, so a topic re-created once more
    since the error was read is not accepted unseen. Restarting at the starting offsets
    would read again a topic the pipeline already read from (`read_before`: a config
    pointed back at an earlier topic), and positions that carry no id (recorded before
    exactly stored ids) may be this very topic: both need `force`.

    A pipeline whose upsert outputs hold rows (`upsert_outputs`: the names of those whose
    table exists) is refused, even with `force`: an upsert orders a key's records by
    (partition, offset), which restart at 0 on the new topic, so the old topic's records
    would win over the new one's for ever (docs/derived-tables.md "Topic re-created"). Their
    tables must be deleted first; each starts again from the new topic, empty
    (jobs/derived/rebuild.py)."""
    if accepted_id != current_id:
        raise DecisionError(
            f"topic {topic} has id {current_id}, not {accepted_id}: accept the id Kafka "
            f"reports now: {_skip_command('new-topic', f'--topic-id {current_id}')}"
        )
    if positions.topic_id == current_id:
        raise DecisionError(
            f"topic {topic}: the positions already belong to id {current_id}; nothing to accept"
        )
    if not positions:
        raise DecisionError(
            f"topic {topic}: the pipeline has no positions yet and starts on id {current_id} "
            "on its own; nothing to accept"
        )
    if current_id in set(read_before) and not force:
        raise DecisionError(
            f"topic {topic}: batches of this pipeline already read topic id {current_id}; "
            "accepting it restarts at the starting offsets and reads those records again; "
            "add --force only to read it again on purpose"
        )
    if positions.topic_id is None and not force:
        raise DecisionError(
            f"topic {topic}: the positions were recorded before exactly stored topic ids, so "
            f"whether id {current_id} is another topic cannot be told; they take that id on "
            "the next plan on their own, while accepting it restarts them at the starting "
            "offsets and may read records again: add --force only if the topic was re-created"
        )
    if upsert_outputs:
        raise DecisionError(
            f"topic {topic}: upsert output(s) {', '.join(upsert_outputs)} order records by "
            "(partition, offset), which restart at 0 on the new topic, so the old topic's "
            "records would win for ever: delete their tables before accepting it, then start "
            f"each again from the new topic with `exactly derived rebuild --empty -c "
            f"{CONFIG_PLACEHOLDER} NAME`"
        )


def resume_skips(
    topic: str,
    stated: Mapping[int, int],
    available: Mapping[int, Available],
    reach: Mapping[int, int],
    *,
    force: bool = False,
) -> list[OffsetRange]:
    """Check `resume-at` positions against Kafka and the table's rows; the ranges they skip.

    `reach` is one past the highest offset of each partition in the published rows. Every
    partition must be stated. A position below the rows' reach reads committed records again
    (duplicates) and one above it skips records Kafka still holds (loss): both are refused
    unless `force`. Offsets below Kafka's earliest are gone whatever is decided; skipping
    them is recorded, like a lost-offsets decision.
    """
    missing = sorted(set(available) - set(stated))
    unknown = sorted(set(stated) - set(available))
    if missing or unknown:
        raise DecisionError(
            f"topic {topic}: state a position for every partition "
            f"{sorted(available)} and no other (missing {missing}, unknown {unknown})"
        )
    skipped = []
    for p in sorted(stated):
        at, avail = stated[p], available[p]
        rows_end = reach.get(p)
        if at < avail.earliest:
            raise DecisionError(
                f"{topic}-{p}: offsets [{at}, {avail.earliest}) are no longer in Kafka; "
                f"continue at {avail.earliest} or later"
            )
        if at > avail.last_stable:
            raise DecisionError(
                f"{topic}-{p}: position {at} is past the last stable offset {avail.last_stable}"
            )
        if rows_end is not None and at < rows_end and not force:
            raise DecisionError(
                f"{topic}-{p}: position {at} would read offsets [{at}, {rows_end}) again, but "
                f"the table already holds them (duplicates); continue at {rows_end}, or add "
                "--force"
            )
        start = rows_end if rows_end is not None else avail.earliest
        if start < avail.earliest:
            skipped.append(OffsetRange(topic, p, start, avail.earliest))
            start = avail.earliest
        if at > start:
            if not force:
                raise DecisionError(
                    f"{topic}-{p}: position {at} would skip offsets [{start}, {at}) that "
                    f"Kafka still holds; continue at {start}, or add --force to drop those "
                    "records on purpose"
                )
            skipped.append(OffsetRange(topic, p, start, at))
    return skipped


def retire_skips(
    topic: str,
    positions: Positions,
    *,
    still_read: bool,
    current_id: str | None,
    available: Mapping[int, Available],
    force: bool = False,
) -> list[OffsetRange]:
    """Check a `retire-topic` decision; the ranges it leaves unread that Kafka still holds.

    Only a topic the pipeline no longer reads (`still_read` False) and whose positions the
    ledger holds may be retired: retiring a topic still read would re-read it from the
    starting offsets at the next plan (duplicates). When Kafka still has the very
    incarnation the positions were read from (`current_id` equal to theirs: dropped from
    `kafka.topics`, not deleted), every record past the positions would never be read:
    refused unless `force`, and then recorded as skipped. A deleted topic (`current_id`
    None) or one re-created since (another id) took its unread records with it: nothing is
    left to skip, and the positions the decision replaces are kept as history.
    """
    if still_read:
        raise DecisionError(
            f"topic {topic}: the pipeline still reads it (the config names it or its pattern "
            "matches it), so retiring it would read it again from its first record; "
            "nothing to retire: delete the topic, or take it out of kafka.topics, first"
        )
    if not positions or positions.retired:
        what = "is retired already" if positions.retired else "holds no positions on it"
        raise DecisionError(f"topic {topic}: the ledger {what}; nothing to retire")
    if current_id is None or positions.topic_id not in (None, current_id):
        return []
    skipped = []
    for p in sorted(set(available) | set(positions)):
        avail = available.get(p)
        if avail is None:
            continue  # a partition Kafka no longer lists holds nothing to read
        start = positions.get(p, avail.earliest)
        if max(start, avail.earliest) >= avail.last_stable:
            continue
        if not force:
            raise DecisionError(
                f"{topic}-{p}: offsets [{max(start, avail.earliest)}, {avail.last_stable}) were "
                "never read, and Kafka still holds them; read them first (name the topic in "
                "the config again), or add --force to leave them unread on purpose"
            )
        skipped.append(OffsetRange(topic, p, start, avail.last_stable))
    return skipped


def resume_command(
    reach: Mapping[int, int], partitions: Sequence[int], topic: str | None = None
) -> str:
    """The `resume-at` command the table's rows suggest (one past their highest offsets);
    naming its `topic` on a pipeline that reads several."""
    stated = " ".join(
        f"--position {p}={reach[p]}" if p in reach else f"--position {p}=OFFSET"
        for p in sorted(set(partitions) | set(reach))
    )
    which = f"--topic {topic} " if topic else ""
    return _skip_command("resume-at", which + (stated or "--position PARTITION=OFFSET"))

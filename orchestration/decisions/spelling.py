"""A refusal's words for the Dagster UI: the job that resolves it, not the command.

The ledger's refusals name what to do as the command line does it (`exactly skip new-topic
-c <config> --topic-id X`, "add --force"): one text for both, written once, where the rule
lives. In a run's failure the operator is in the UI, so the same sentence names the
`<pipeline>_decide` job and its Launchpad config instead (`kind: new-topic, topic_id: X`),
`exactly recover` the `<pipeline>_recover` job, `exactly abandon` the `<pipeline>_abandon`
job and `exactly derived rebuild` the `<pipeline>_rebuild` job. Pure text, tested on the
ledger's own sentences (tests/test_decide_job.py).
"""

from __future__ import annotations

import re
import shlex

from orchestration.names import dagster_name

#: the ledger's commands end with `--reason '...'` (ledger/core/decision_rules.py), some in
#: backticks
_SKIP = re.compile(r"`?exactly skip (?P<kind>[a-z-]+) -c \S+(?P<args>.*?) --reason '\.\.\.'`?")
_RECOVER = re.compile(r"`?exactly recover -c [^\s`]+`?")
_REBUILD = re.compile(
    r"`?exactly derived rebuild(?P<empty> --empty)? -c [^\s`]+ (?P<output>[A-Za-z0-9_]+)`?"
)
_ABANDON = re.compile(
    r"`?exactly abandon -c \S+ (?P<id>\d+)(?P<backfill> --backfill)? --reason '\.\.\.'`?"
)
#: the CLI's flags and the decide job's config keys (longest first: --topic-id before --topic)
_FLAGS = {
    "topic-id": "topic_id",
    "topic": "topic",
    "position": "positions",
    "partition": "partition",
    "reason": "reason",
    "force": "force",
    "to": "to",
}
_FLAG = re.compile(r"--(" + "|".join(_FLAGS) + r")\b")


def _launchpad(kind: str, args: str) -> str:
    """`kind` and the command's options as the decide job's config, in YAML flow style."""
    words = shlex.split(args)
    config = [f"kind: {kind}"]
    positions: list[str] = []
    i = 0
    while i < len(words):
        flag = words[i].removeprefix("--")
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        i += 2 if value is not None else 1
        if flag == "position" and value is not None:
            partition, _, offset = value.partition("=")
            positions.append(f"'{partition}': {offset}")
        elif flag in _FLAGS:
            config.append(f"{_FLAGS[flag]}: {value if value is not None else 'true'}")
    if positions:
        config.append("positions: {" + ", ".join(positions) + "}")
    return ", ".join([*config, "reason: <why>"])


def _key(flag: re.Match[str]) -> str:
    """A CLI flag as the decide job's config key."""
    return "`force: true`" if flag[1] == "force" else f"`{_FLAGS[flag[1]]}`"


def as_launchpad(text: str, pipeline: str, flags: bool = False) -> str:
    """`text` with each `exactly skip`/`recover`/`abandon`/`derived rebuild` command as the
    job that does it; with `flags` (a decision's own refusal), its option names as the
    decide job's keys."""
    name = dagster_name(pipeline)
    text = _SKIP.sub(
        lambda m: f"the {name}_decide job with `{_launchpad(m['kind'], m['args'])}`", text
    )
    text = _RECOVER.sub(f"the {name}_recover job", text)
    text = _REBUILD.sub(
        lambda m: (
            f"the {name}_rebuild job with `output: {m['output']}"
            + (", empty: true" if m["empty"] else "")
            + ", reason: <why>`"
        ),
        text,
    )
    text = _ABANDON.sub(
        lambda m: (
            f"the {name}_abandon job with `batch_id: {m['id']}"
            + (", backfill: true" if m["backfill"] else "")
            + ", reason: <why>`"
        ),
        text,
    )
    if flags:
        text = _FLAG.sub(_key, text)
    return text

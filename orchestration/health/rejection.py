"""Telling rejected input from a failure of the system, in the UI and in the alerts.

A backfill that a protocol rule refuses (ledger/core/backfill.py), a request over a batch whose
attempt may still be running, a topic that is not the one the positions were read from:
the operator asked for something the pipeline must not do, and nothing was written. Such a
run still ends as a failure (it did not do what was asked), but as one plain sentence
instead of a stack trace, marked with REJECTED_TAG so that the run-failure sensor does not
page anyone over it (orchestration/health/run_failure_sensor.py).

The run's event log shows the sentence alone, without the stack trace Dagster prints under
every other op failure. Dagster 1.13 serializes a step failure from the traceback of the
exception it catches (`serializable_error_info_from_exc_info`), and that traceback always
holds Dagster's own frames between the op and the executor; the UI prints "Stack Trace"
whenever the serialized error has frames. The one exception it does not serialize from its
traceback is a `DagsterUserCodeProcessError` carrying one `SerializableErrorInfo`: that
info is shown as it is (how an error from a code server reaches the UI). A `Refusal` is that
and a `dg.Failure` at once: the executor handles it as a Failure (the sentence and the
request's metadata as the failure's, no retry) and shows as its error the info it carries:
the sentence, no frames. tests/test_rejected_input.py checks both on a real run, so a
Dagster upgrade that changes either path fails there rather than in front of an operator.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dagster as dg
from dagster._core.errors import DagsterUserCodeProcessError
from dagster._utils.error import SerializableErrorInfo

from ledger.core.backfill import BackfillError
from ledger.core.errors import (
    BusyError,
    DataLossError,
    DecisionError,
    ExactlyError,
    TopicChangedError,
)
from orchestration.decisions.spelling import as_launchpad
from orchestration.resources import resource_in
from orchestration.tags import REJECTED_TAG

#: Refusals of the operator's request. Their messages name what was refused (the rule, the
#: batch, the offsets) and, for the CLI too, what to do; where one does not say what to do,
#: the advice here completes the sentence.
REJECTIONS: Mapping[type[ExactlyError], str | None] = {
    BackfillError: None,
    BusyError: None,
    TopicChangedError: None,
    DataLossError: "choose ranges that Kafka still holds",
    DecisionError: None,
}


def rejection_sentence(exc: ExactlyError) -> str:
    """The refusal and what to do, as the one sentence the run shows."""
    advice = next(text for kind, text in REJECTIONS.items() if isinstance(exc, kind))
    refusal = " ".join(str(exc).split()).rstrip(".")
    return f"Refused: {refusal}; {advice}." if advice else f"Refused: {refusal}."


@contextmanager
def rejections_end_the_run(
    context: dg.OpExecutionContext, pipeline: str, metadata: Mapping[str, Any]
) -> Iterator[None]:
    """Turn a refusal raised inside into a failure of the run that is plainly rejected input.

    Only the refusals in REJECTIONS; any other error stays a failure of the system, alert
    included (shown in one line by orchestration/health/failures.py where the op takes it).
    `metadata` describes the request, shown beside the sentence.
    """
    try:
        yield
    except tuple(REJECTIONS) as exc:
        sentence = rejection_sentence(exc)
        raise rejected(context, pipeline, sentence, type(exc).__name__, metadata) from None


class Refusal(DagsterUserCodeProcessError, dg.Failure):
    """A failure of the step that Dagster shows as `sentence` alone (see the module's
    docstring for why it is both)."""

    def __init__(self, sentence: str, metadata: Mapping[str, Any]) -> None:
        shown = SerializableErrorInfo(message=sentence, stack=[], cls_name=type(self).__name__)
        super().__init__(sentence, user_code_process_error_infos=[shown])
        # DagsterUserCodeProcessError's constructor reaches Failure's with the sentence only
        self.metadata = dg.Failure(sentence, metadata).metadata
        self.allow_retries = False


def rejected(
    context: dg.OpExecutionContext,
    pipeline: str,
    sentence: str,
    refused_by: str,
    metadata: Mapping[str, Any],
) -> Refusal:
    """Mark the run as rejected input and return the failure that ends it with `sentence`,
    the commands it names as the jobs that do them (orchestration/decisions/spelling.py)
    and the rest spelled for the pipeline's config file."""
    context.instance.add_run_tags(context.run_id, {REJECTED_TAG: refused_by})
    launchpad = as_launchpad(sentence, pipeline, flags=refused_by == DecisionError.__name__)
    shown = resource_in(context, pipeline).spell(launchpad)
    return Refusal(shown, {**metadata, "refused_by": refused_by})

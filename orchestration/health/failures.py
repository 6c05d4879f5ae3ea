"""Every failure of an op as one line in Dagster's run view, as the CLI says it.

Why: an op that fails on a full disk under Spark shows, by Dagster's default, a Python stack
trace and a Py4J error whose text is hundreds of Java lines; the cause is buried there, and
the run-failure sensor's alert quotes the same text. `failures_are_one_line` turns what an
op raises into the line the CLI prints (exactly_cli, resources/failures/causes.py):

- an `ExactlyError`: its message, the commands it names as the jobs that do them
  (orchestration/decisions/spelling.py), the rest spelled for the config file;
- a known cause (no space left, a read-only folder, Spark out of memory, ...): one line
  naming the cause and the path or service;
- anything else: one line saying which op failed, what the error said first, and the log
  file (under the state folder) that holds its full traceback, Java stack included.

The line is the failure's description and the whole error shown (`OneLineFailure`, which
Dagster prints without frames: see orchestration/health/rejection.py for how). Unlike a refusal,
such a run is a failure of the system: it is not tagged as rejected input, so the run-failure
sensor alerts with the line; retries stay allowed. A `dg.Failure` raised inside (a refusal
among them) passes unchanged.

Ops take it as a decorator under `@dg.op` (`one_line_failures(pipeline)`), which keeps the
op function's signature and annotations, so Dagster reads its inputs and config from the op itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import dagster as dg
from dagster._core.errors import (
    DagsterError,
    DagsterExecutionInterruptedError,
    DagsterUserCodeProcessError,
)
from dagster._utils.error import SerializableErrorInfo

from ledger.core.errors import ExactlyError
from orchestration.decisions.spelling import as_launchpad
from orchestration.resources import resource_in
from resources.failures.causes import FailureContext, context_of
from resources.failures.lines import UNFORESEEN, describe_failure, one_line


class OneLineFailure(DagsterUserCodeProcessError, dg.Failure):
    """A failure of the step that Dagster shows as `line` alone: a `dg.Failure` (the line
    and `metadata` are the failure's) that is also a user-code process error carrying one
    frameless error info, which is what the run view prints."""

    def __init__(self, line: str, metadata: Mapping[str, Any]) -> None:
        shown = SerializableErrorInfo(message=line, stack=[], cls_name=type(self).__name__)
        super().__init__(line, user_code_process_error_infos=[shown])
        # DagsterUserCodeProcessError's constructor reaches Failure's with the line only
        self.metadata = dg.Failure(line, metadata).metadata
        self.allow_retries = True


class Terminated(DagsterUserCodeProcessError, DagsterExecutionInterruptedError):
    """A run terminated (from the UI, or its worker interrupted) mid-step, shown as one
    sentence about its batch instead of Dagster's interruption stack trace. Being an
    interruption, Dagster still handles it as one (the step fails as interrupted, the run
    ends canceled); being a user-code process error with one frameless info, that info is
    what the run view prints (the same path as OneLineFailure)."""

    def __init__(self, sentence: str) -> None:
        shown = SerializableErrorInfo(message=sentence, stack=[], cls_name=type(self).__name__)
        super().__init__(sentence, user_code_process_error_infos=[shown])


def terminated(context: dg.OpExecutionContext, pipeline: str) -> Terminated:
    """The one-sentence interruption of a run: what became of the batch it planned (its
    `exactly/batch` tag, as the ledger has it now)."""
    from orchestration.health.fates import terminated_text
    from orchestration.tags import BATCH_TAG

    tag = None
    try:
        run = context.instance.get_run_by_id(context.run_id)
        tag = run.tags.get(BATCH_TAG) if run is not None else None
        if tag is None:
            return Terminated(terminated_text(None))
        app_id, _, batch_id = tag.rpartition("/")
        resource = resource_in(context, pipeline)
        batch = resource.pipeline().store.get(app_id or resource.config().app_id, int(batch_id))
        return Terminated(terminated_text(batch))
    except Exception:  # the ledger cannot say now: say what is always true
        return Terminated(
            f"Terminated while working on batch {tag or '(none planned)'}; recovery finishes "
            "or abandons it by the protocol's rules, and this run's log then says which."
        )


def _as_is(text: str) -> str:
    return text


def one_line_failure(
    exc: Exception, what: str, context: FailureContext, spell: Callable[[str], str] = _as_is
) -> OneLineFailure:
    """The one-line failure for `exc`, raised by `what` (an op's name): `spell` puts the
    config file's path into the commands an ExactlyError names."""
    if isinstance(exc, ExactlyError):
        return OneLineFailure(one_line(spell(str(exc))), {"cause": type(exc).__name__})
    found = describe_failure(exc, what, context)
    metadata: dict[str, Any] = {"cause": found.cause}
    if found.cause == UNFORESEEN:
        metadata["traceback_log"] = str(found.log) if found.log else "not written"
    return OneLineFailure(found.line, metadata)


@contextmanager
def failures_are_one_line(context: dg.OpExecutionContext, pipeline: str) -> Iterator[None]:
    """Whatever the op raises inside, except a `dg.Failure` or Dagster's own errors, ends
    the step with one line (see the module's docstring)."""
    try:
        yield
    except Terminated:
        raise
    except DagsterExecutionInterruptedError:
        raise terminated(context, pipeline) from None
    except (dg.Failure, DagsterError):
        raise
    except Exception as exc:
        resource = resource_in(context, pipeline)
        try:
            where = context_of(resource.config())
        except Exception:
            where = FailureContext()

        def spell(text: str) -> str:  # in the UI, a command is the job that does it
            return resource.spell(as_launchpad(text, pipeline))

        raise one_line_failure(exc, context.op.name, where, spell) from None


_Op = TypeVar("_Op", bound=Callable[..., Any])


def one_line_failures(pipeline: str) -> Callable[[_Op], _Op]:
    """An op function whose failures end the step in one line (`failures_are_one_line`);
    for ops that yield their outputs and ops that return them alike."""

    def decorate(fn: _Op) -> _Op:
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def yielding(context: dg.OpExecutionContext, *args: Any, **kwargs: Any) -> Any:
                with failures_are_one_line(context, pipeline):
                    yield from fn(context, *args, **kwargs)

            return yielding  # type: ignore[return-value]

        @functools.wraps(fn)
        def returning(context: dg.OpExecutionContext, *args: Any, **kwargs: Any) -> Any:
            with failures_are_one_line(context, pipeline):
                return fn(context, *args, **kwargs)

        return returning  # type: ignore[return-value]

    return decorate

"""Ray Tune's function API: ``report(metrics, checkpoint=...)`` and ``get_checkpoint()``.

A function trainable::

    def train_fn(config):
        start = 0
        if (ckpt := get_checkpoint()) is not None:
            with ckpt.as_directory() as d:
                start = int(open(f"{d}/step").read())
        for step in range(start, 100):
            with tempfile.TemporaryDirectory() as d:
                open(f"{d}/step", "w").write(str(step + 1))
                report({"loss": 1 / (step + 1)}, checkpoint=Checkpoint.from_directory(d))

popflow runs the function in segments that end at the scheduler's decision
points (a PBT perturbation point, an ASHA rung) or a stop condition. Between
segments the function waits inside ``report()`` on its worker and goes on
when the trial continues (:mod:`popflow.tasks.live`). When it cannot (the trial was
paused, cloned, or its worker was lost), ``report`` unwinds the function by
raising :class:`SegmentEnd` (a BaseException, so ``except Exception`` in user
code does not swallow it) and the next segment calls it again, with
``get_checkpoint()`` returning the checkpoint to resume from: report
checkpoints if the scheduler pauses or clones trials.

As in Ray, the function may also hand metrics back without ``report``: a returned dict
is one more result (its own iteration, after any it reported), each dict a generator
function yields is a result, and a number is ``{"_metric": number}`` (Ray's
``DEFAULT_METRIC``). None (and an empty dict) reports nothing; anything else is an error.
"""

from __future__ import annotations

import inspect
import numbers
import threading
from collections.abc import Callable
from typing import Any

from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.trial_context import get_context

#: the key a returned or yielded number is reported under (Ray's ``DEFAULT_METRIC``)
DEFAULT_METRIC = "_metric"


class SegmentEnd(BaseException):
    """Raised inside ``report`` to unwind the user's function at a segment boundary."""


class _ReportFailed(BaseException):
    """Carries an error popflow raised inside ``report`` (a stop condition naming a missing
    key, a checkpoint upload failing) past ``except Exception`` in user code; the segment
    then fails with the original error."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


class _Session(threading.local):
    # (on_report, restore checkpoint) of the segment running in this thread
    active: tuple[Callable[[dict[str, Any], Checkpoint | None], bool], Checkpoint | None] | None = (
        None
    )


_session = _Session()


def _require_session() -> tuple[
    Callable[[dict[str, Any], Checkpoint | None], bool], Checkpoint | None
]:
    if _session.active is None:
        raise RuntimeError(
            "report() and get_checkpoint() only work inside a function trainable run by popflow.run()"
        )
    return _session.active


def report(metrics: dict[str, Any], *, checkpoint: Checkpoint | None = None) -> None:
    """Report one iteration's metrics, optionally with a checkpoint folder to keep."""
    if not isinstance(metrics, dict):
        raise TypeError(f"report() takes a dict of metrics, got {type(metrics).__name__}")
    on_report, _ = _require_session()
    try:
        end = on_report(metrics, checkpoint)
    except Exception as e:
        raise _ReportFailed(e) from e
    if end:
        raise SegmentEnd()


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint this run should resume from (None on a fresh start)."""
    return _require_session()[1]


def run_in_session(
    fn: Callable[[dict[str, Any]], Any],
    config: dict[str, Any],
    on_report: Callable[[dict[str, Any], Checkpoint | None], bool],
    restore: Checkpoint | None,
) -> bool:
    """Run ``fn(config)`` with ``report`` wired to ``on_report``.

    ``on_report`` returns True to end the segment. Returns True if the function
    returned by itself (the trial is finished), False if the segment ended it. What it
    returns or yields is reported as Ray does (:func:`_report_output`).
    """
    _session.active = (on_report, restore)
    try:
        output = fn(dict(config))
        if inspect.isgenerator(output):  # after the call: with_parameters wraps it
            try:
                for item in output:
                    _report_output(fn, item, "yielded")
            finally:  # a segment end unwinds it here: its own finally blocks run now
                output.close()
        else:
            _report_output(fn, output, "returned")
        return True
    except SegmentEnd:
        return False
    except _ReportFailed as failed:
        raise failed.error from None
    finally:
        _session.active = None


def _report_output(fn: Callable[..., Any], output: Any, verb: str) -> None:
    """Report what the function returned or yielded, as Ray's ``wrap_function`` does: a
    dict as it is, a number as ``{"_metric": number}``, None or ``{}`` not at all. (Ray
    also drops a 0 and any other false value; popflow reports a 0 and refuses the rest.)"""
    if output is None or (isinstance(output, dict) and not output):
        return
    if isinstance(output, dict):
        report(output)
    elif isinstance(output, numbers.Real) and not isinstance(output, bool):
        report({DEFAULT_METRIC: output})
    else:
        name = getattr(fn, "__name__", type(fn).__name__)
        try:
            trial = f"trial {get_context().trial_id}: "
        except RuntimeError:
            trial = ""
        raise TypeError(
            f"{trial}the function trainable {name!r} {verb} {output!r} "
            f"({type(output).__name__}); a function trainable may return or yield a dict "
            "of metrics, a number (reported as '_metric') or None"
        )

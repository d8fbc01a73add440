"""Prefect events a run emits for automations to act on (a webhook on a new best...).

=================================  ==========================================================
event                              when
=================================  ==========================================================
``popflow.round.committed``        a round is committed: its number, the best metric, the
                                   trials by status
``popflow.trial.new-best``         a committed round has a better best trial than any before
                                   in this run: its metric, config and latest checkpoint
``popflow.trial.errored``          a trial errored for good: the first line of its error
``popflow.experiment.finished``    the experiment ended: every trial ended
``popflow.experiment.stopped-early``  the run ended with trials to go (its budget, a cancel),
                                   or ``fail_fast``/a stopper ended the experiment
=================================  ==========================================================

Each event's resource is the experiment (``popflow.experiment.<name>``); its related
resources are the ``tune`` flow run, its flow, its deployment (if any) and its tags, as
on Prefect's own flow-run events. The training thread builds the payloads from the
driver's events (:class:`EventNotices`, cheap: no Prefect) and puts them on the run's
feed; the Prefect record's thread emits them (:func:`emit_notice`). Dask workers never
emit anything.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from popflow.flows.events.run_events import Event, RoundCommitted, RunEnded, TrialErrored
from popflow.flows.experiment.results import flatten

if TYPE_CHECKING:
    from popflow.flows.driver.controller import Controller
    from popflow.flows.record.run_feed import Notice, RunFeed

logger = logging.getLogger(__name__)

ROUND_COMMITTED = "popflow.round.committed"
NEW_BEST = "popflow.trial.new-best"
TRIAL_ERRORED = "popflow.trial.errored"
FINISHED = "popflow.experiment.finished"
STOPPED_EARLY = "popflow.experiment.stopped-early"


def _number(value: Any) -> float | None:
    """``value`` as a finite float (None: not a number): an event's payload is JSON."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value) if math.isfinite(value) else None


class EventNotices:
    """A subscriber to the driver's events that puts the Prefect events on ``feed``;
    ``controller()``: the run's current controller (its records and spec)."""

    def __init__(self, feed: RunFeed, controller: Callable[[], Controller | None]) -> None:
        self.feed = feed
        self.controller = controller
        self._best: float | None = None  # the best metric announced so far (mode's sign)

    def __call__(self, event: Event) -> None:
        controller = self.controller()
        if controller is None:
            return
        if isinstance(event, TrialErrored):
            # the trace's last line (the exception's), its first line if several
            error = (event.reason.strip().splitlines() or [""])[0]
            self._notice(
                controller, TRIAL_ERRORED, {"trial_id": event.record.trial_id, "error": error}
            )
        elif isinstance(event, RoundCommitted) and event.round > 0:
            # round 0's commit is the sampled population, before any training: no round
            self._committed(controller, event)
        elif isinstance(event, RunEnded):
            self._ended(controller, event)

    def _committed(self, controller: Controller, event: RoundCommitted) -> None:
        spec = controller.spec
        best = self._best_trial(controller)
        metric = best[1] if best else None
        counts = {str(getattr(k, "value", k)).lower(): n for k, n in event.counts.items()}
        self._notice(
            controller,
            ROUND_COMMITTED,
            {
                "round": event.round,
                "results": event.results,
                "metric": spec.metric,
                "mode": spec.mode,
                "best_metric": metric,
                "best_trial": best[0].trial_id if best else None,
                "trials": counts,
            },
        )
        if best is None:
            return
        rec, value = best
        signed = -value if spec.mode == "min" else value
        if self._best is not None and signed <= self._best:
            return
        self._best = signed
        checkpoint = (
            controller.storage.full_url(rec.dirname, rec.checkpoints[-1].name)
            if rec.checkpoints
            else None
        )
        self._notice(
            controller,
            NEW_BEST,
            {
                "round": event.round,
                "trial_id": rec.trial_id,
                "metric": spec.metric,
                "mode": spec.mode,
                "value": value,
                "training_iteration": (rec.trial.last_result or {}).get("training_iteration"),
                "config": _jsonable(flatten(rec.trial.config)),
                "checkpoint": checkpoint,
            },
        )

    def _ended(self, controller: Controller, event: RunEnded) -> None:
        early = controller.early_end
        best = self._best_trial(controller)
        payload: dict[str, Any] = {
            "rounds": event.rounds,
            "trials": len(controller.records),
            "errors": sum(1 for r in controller.records if r.error),
            "metric": controller.spec.metric,
            "best_metric": best[1] if best else None,
            "best_trial": best[0].trial_id if best else None,
        }
        if event.budget_spent:
            payload["reason"] = early.ended_by
            payload["trials_to_go"] = sum(1 for r in controller.records if r.trial.is_live)
        elif early.due:
            payload["reason"] = early.why
        self._notice(controller, STOPPED_EARLY if "reason" in payload else FINISHED, payload)

    def _best_trial(self, controller: Controller) -> tuple[Any, float] | None:
        """The trial whose latest result has the best metric, and that metric."""
        metric, mode = controller.spec.metric, controller.spec.mode
        if not metric or mode not in ("min", "max"):
            return None
        best: tuple[Any, float] | None = None
        for rec in controller.records:
            value = _number((rec.trial.last_result or {}).get(metric))
            if value is None:
                continue
            if best is None or (value > best[1] if mode == "max" else value < best[1]):
                best = (rec, value)
        return best

    def _notice(self, controller: Controller, event: str, payload: dict[str, Any]) -> None:
        self.feed.notice(event, {"experiment": controller.spec.name, **payload})


def _jsonable(config: dict[str, Any]) -> dict[str, Any]:
    """A config's values as JSON takes them (others as their text)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        ok = value is None or isinstance(value, str | bool | int) or _number(value) is not None
        out[str(key)] = value if ok else repr(value)
    return out


def emit_notice(notice: Notice) -> None:
    """Emit ``notice`` as a Prefect event, in the ``tune`` flow run (the record's thread);
    trouble with Prefect is logged, never the run's."""
    try:
        from prefect.context import FlowRunContext
        from prefect.events import emit_event
        from prefect.types._datetime import from_timestamp

        name = notice.payload.get("experiment", "")
        resource = {
            "prefect.resource.id": f"popflow.experiment.{name}",
            "prefect.resource.name": name,
        }
        emit_event(
            event=notice.event,
            resource=resource,
            related=_related(FlowRunContext.get()),
            payload=notice.payload,
            occurred=from_timestamp(notice.at),
        )
    except Exception:  # an event is never worth the run
        logger.warning("could not emit the Prefect event %s", notice.event, exc_info=True)


def _related(ctx: Any) -> list[Any]:
    """The ``tune`` flow run (role ``flow-run``), its flow, deployment and tags: as the
    heartbeat's related resources (:mod:`popflow.flows.record.heartbeat`), and its own."""
    from prefect.events.schemas.events import RelatedResource

    from popflow.flows.record.heartbeat import _event_template

    if ctx is None or ctx.flow_run is None:
        return []
    resource, related = _event_template(ctx)
    run = {
        "prefect.resource.id": resource["prefect.resource.id"],
        "prefect.resource.name": resource["prefect.resource.name"],
        "prefect.resource.role": "flow-run",
    }
    return [RelatedResource.model_validate(run), *related]

"""The driver's side of :mod:`popflow.tasks.runner`: one runner actor per trial slot.

``submit`` sends a pack of segments to a runner, preferring the worker where
the pack's trainables are parked; ``finished`` blocks until calls return.
Results come back through the client's event loop into a queue, so the
driver's thread never makes a blocking round trip per call.

Each runner holds its slot through a ``hold_slot`` Dask task that asks for the
trial's resources (:mod:`popflow.tasks.runner`), so Dask accounts for it.

A call that fails returns :class:`CallFailed`. If its worker died, that
worker's runners are dropped and runners are made on workers that joined (a
restarted worker comes back under a new address: the embedded cluster's nanny
restarts a worker whose process died). A failed call says whether it was running
when its worker died, and whether it ran there alone (a call submitted with
``exclusive``: nothing else runs on its worker until it returns), so the driver can
tell the trial that took the process down from those that only shared it. Nothing
the driver sends a worker blocks it: a runner call is an actor call, answered
through the event loop, and a call to a worker already gone fails as lost at once.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from distributed import Client, Future, wait

from popflow.flows.backends.runners import CallFailed, Runner, pick_runner
from popflow.flows.backends.slot_resize import resize
from popflow.flows.backends.storage_probe import StorageProbe
from popflow.infra.cluster.dask_cluster import slots_per_worker
from popflow.infra.cluster.gpus import shared_process_warning
from popflow.infra.cluster.scheduler_link import cluster_workers
from popflow.tasks.runner import SegmentRunner, early_restores, hold_slot, pack_specs
from popflow.tasks.specs import Published, SegmentSpec

logger = logging.getLogger(__name__)

#: Seconds between looks for workers that joined the cluster (a look is one request to the
#: scheduler; a round begins with one once this has passed: a synchronous round longer than
#: this uses a worker that joined during the round before)
REFRESH_INTERVAL_S = 1.0
#: Seconds to wait for a worker when the cluster has none.
WORKER_WAIT_S = 120.0
#: Seconds between looks at whether a worker whose runner is being made is still there.
ACTOR_LOOK_S = 2.0


class WorkerGone(RuntimeError):
    """The worker a runner was being made on left the cluster first."""


#: Seconds between the waiting driver's looks at what is still running.
WAIT_POLL_S = 1.0
#: Seconds the driver waits for its slots to be given back when it closes (a slot whose
#: segment still runs, as after a time budget, is cancelled then).
CLOSE_WAIT_S = 2.0


class RunnerPool:
    def __init__(
        self,
        client: Client,
        resources: Mapping[str, float] | None = None,
        label: str = "trials",
        probe: StorageProbe | None = None,
        resizes: bool = False,
    ) -> None:
        """``resources``: what one trial holds (Dask's names); ``label``: the experiment's
        name, in the slot tasks' keys that the Dask dashboard shows; ``probe``: each
        worker must see the storage before it gets runners (:mod:`.storage_probe`);
        ``resizes``: a slot may be made again to hold what its next trial holds
        (:meth:`resize`; the workers declare the resources the trials share)."""
        self.client = client
        self.resizes = resizes
        self.probe = probe
        #: workers that do not see the storage: never given runners
        self._unseeing: set[str] = set()
        self.resources = resources
        self.label = re.sub(r"[^A-Za-z0-9_.]+", "_", label) or "trials"
        self.runners: list[Runner] = []
        self._dead_workers: set[str] = set()  # addresses of workers that died under a call
        self._done: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._ids = itertools.count()
        self._calls: dict[int, Runner] = {}
        self._sizes: dict[int, int] = {}  # call in flight -> its segments
        self.started: dict[int, float] = {}  # running call -> since when (monotonic)
        #: dead worker -> the calls that were running on it when its death was first seen
        self._running_at_death: dict[str, frozenset[int]] = {}
        #: worker -> the call running there alone (see :meth:`exclusive_runner`)
        self._exclusive: dict[str, int] = {}
        self._refreshed = 0.0
        self._probed = False  # the first workers have been asked
        self.refresh()

    @property
    def slots(self) -> int:
        return len(self.runners)

    def refresh(self) -> None:
        """Drop runners of gone workers; make runners on workers that have none.

        With no runner left, wait up to ``WORKER_WAIT_S`` for a worker (a
        killed worker's nanny restarts it within seconds).
        """
        deadline = time.monotonic() + WORKER_WAIT_S
        self._make_runners()
        while not self.runners:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no Dask worker to run segments on after waiting {WORKER_WAIT_S:.0f} s"
                )
            time.sleep(0.2)  # polling the scheduler for a worker that is starting
            self._make_runners()
        self._refreshed = time.monotonic()

    def _make_runners(self) -> None:
        per_worker = slots_per_worker(self.client, self.resources)
        self._probe([w for w in per_worker if w not in self._dead_workers | self._unseeing])
        alive = {w for w in per_worker if w not in self._dead_workers | self._unseeing}
        gone = [r for r in self.runners if r.worker not in alive]
        if gone:
            self.client.cancel([r.hold for r in gone] + [r.future for r in gone])
        self.runners = [r for r in self.runners if r.worker in alive]
        have = {r.worker for r in self.runners}
        new = [(w, n) for w, n in per_worker.items() if w in alive and w not in have]
        gpu = (self.resources or {}).get("GPU", 0.0)
        threads = self._threads() if gpu and new else {}
        made = []
        for w, n in new:
            if gpu and (why := shared_process_warning(w, n, threads.get(w, 1), gpu)):
                logger.warning(why)
            for slot in range(n):
                token = uuid.uuid4().hex
                actor = self.client.submit(
                    SegmentRunner, w, token, slot, gpu, actor=True, workers=[w], pure=False
                )
                made.append((w, token, actor))
        # every actor made before any hold is submitted: making one takes a worker thread,
        # which a hold, once running, keeps
        made_on = []
        for w, token, actor in made:
            try:
                made_on.append((w, token, actor, self._made(w, actor)))
            except Exception as exc:  # the worker died meanwhile (a trial took it down)
                logger.warning("no runner on worker %s: %s: %s", w, type(exc).__name__, exc)
                self._dead_workers.add(w)
        for w, token, actor, handle in made_on:
            hold = self.client.submit(
                hold_slot,
                token,
                key=f"popflow-{self.label}-slot-{token}",
                workers=[w],
                allow_other_workers=False,
                resources=dict(self.resources) if self.resources else None,
                pure=False,
            )
            self.runners.append(Runner(w, handle, actor, hold, resources=self.resources))
        if made:
            logger.debug("runners: %d on %d workers", len(self.runners), len(alive))

    def resize(self, runner: Runner, resources: Mapping[str, float] | None) -> Runner | None:
        """``runner`` (idle) made again holding ``resources`` (:func:`.slot_resize.resize`)."""
        return resize(self, runner, resources)

    def _probe(self, workers: list[str]) -> None:
        """Ask ``workers`` without runners yet whether they see the storage: the first
        look's must all see it (else :class:`StorageUnseen`); a worker that joined later
        and does not is left out."""
        have = {r.worker for r in self.runners}
        new = [w for w in workers if w not in have]
        if self.probe is None or not new:
            return
        unseen = self.probe.unseen(self.client, new)
        if unseen and not self._probed:
            raise self.probe.refusal(unseen, len(new))
        self._probed = True
        for worker, why in unseen.items():
            logger.error(
                "Dask worker %s joined but does not see the storage %s (%s): it gets no trials",
                worker,
                self.probe.storage.url,
                why,
            )
            self._unseeing.add(worker)

    def _made(self, worker: str, actor: Future) -> Any:
        """The runner ``actor`` on ``worker`` once made. A task bound to a worker that left
        before it ran waits for it for ever: looked at every ``ACTOR_LOOK_S``, a worker no
        longer in the cluster raises (a run hung so in CI, a trial having taken the
        worker down as its runners were being made)."""
        while True:
            try:
                return actor.result(timeout=ACTOR_LOOK_S)
            except TimeoutError:
                if worker not in cluster_workers(self.client):
                    self.client.cancel([actor])
                    raise WorkerGone(f"worker {worker} left before its runner was made") from None

    def _threads(self) -> dict[str, int]:
        """Each worker's threads, by address (one look at the scheduler)."""
        workers = cluster_workers(self.client)
        return {w: int(info.get("nthreads", 1)) for w, info in workers.items()}

    def refresh_soon(self) -> None:
        """Pick up workers that joined, at most every ``REFRESH_INTERVAL_S``."""
        if time.monotonic() - self._refreshed >= REFRESH_INTERVAL_S:
            self.refresh()

    def runner_for(self, worker: str | None = None, idle_first: bool = False) -> Runner | None:
        """The runner for a call (:func:`pick_runner`); None while every worker runs an
        exclusive call."""
        if not self.runners:
            self.refresh()
        free = [r for r in self.runners if r.worker not in self._exclusive]
        return pick_runner(free, worker, idle_first) if free else None

    def exclusive_runner(self) -> Runner | None:
        """A runner on a worker where nothing runs nor waits, for a call to run there
        alone (``submit(..., exclusive=True)``); None while there is no such worker."""
        if not self.runners:
            self.refresh()
        busy = {r.worker for r in self.runners if r.queued} | set(self._exclusive)
        return next((r for r in self.runners if r.worker not in busy), None)

    def submit(self, specs: list[SegmentSpec], runner: Runner, exclusive: bool = False) -> int:
        """Queue ``specs`` on ``runner`` (:meth:`runner_for`, or :meth:`exclusive_runner`
        with ``exclusive``: no other call goes to its worker until this one returns);
        return the call's id."""
        runner.queued += 1
        call = next(self._ids)
        if runner.queued == 1:  # nothing ahead of it on this runner: it starts now
            self.started[call] = time.monotonic()
        self._calls[call] = runner
        self._sizes[call] = len(specs)
        if exclusive:
            self._exclusive[runner.worker] = call
        blob = pack_specs(specs)
        try:
            # a call that waits behind another downloads its restores meanwhile
            future = runner.actor.run(blob, early_restores(specs) if runner.queued > 1 else [])
        except RuntimeError as exc:  # "Worker holding Actor was lost": not noticed here yet
            lost = CallFailed(f"worker {runner.worker} was lost ({exc})", True)
            self._done.put((call, lost))
        else:
            self.client.loop.add_callback(self._deliver, call, future, runner.worker)
        return call

    async def _deliver(self, call: int, future: Any, worker: str) -> None:
        value: Any
        try:
            value = await future
        except OSError as exc:  # the worker's connection closed under the call
            value = CallFailed(f"worker {worker} was lost ({type(exc).__name__}: {exc})", True)
        except Exception as exc:
            value = CallFailed(
                f"the call failed on worker {worker}: {type(exc).__name__}: {exc}",
                False,
                code_missing=type(exc).__name__ == "SpecsUnreadable",
            )
        self._done.put((call, value))

    def finished(
        self, on_wait: Callable[[], None] | None = None, until: float | None = None
    ) -> list[tuple[int, Any]]:
        """Block until a call returns; every call returned by now, as (id, outcomes or error).

        ``on_wait`` runs every ``WAIT_POLL_S`` while nothing returns (the
        controller watches for hung segments there, and for a lost lease). ``until``
        (``time.monotonic()`` seconds): return (nothing) then if nothing has returned.
        """
        while True:
            wait_s = WAIT_POLL_S if until is None else min(WAIT_POLL_S, until - time.monotonic())
            try:
                done = [self._done.get(timeout=max(wait_s, 0.0))]
                break
            except queue.Empty:
                self.check_scheduler()
                if on_wait is not None:
                    on_wait()
                if until is not None and time.monotonic() >= until:
                    return []
        while True:
            try:
                done.append(self._done.get_nowait())
            except queue.Empty:
                break
        if any(isinstance(v, CallFailed) and v.worker_lost for _, v in done):
            self.check_scheduler()  # its workers close with it: not one worker's death
        out = []
        for call, value in done:
            runner = self._calls.get(call)
            if runner is None:
                continue  # cancelled
            if isinstance(value, CallFailed) and value.worker_lost:
                self._worker_died(runner.worker)
                value.running = call in self._running_at_death[runner.worker]
                value.alone = self._exclusive.get(runner.worker) == call
            if self._exclusive.get(runner.worker) == call:
                del self._exclusive[runner.worker]
            del self._calls[call]
            self._sizes.pop(call, None)
            self.started.pop(call, None)
            runner.queued -= 1
            out.append((call, value))
        self._mark_started()
        if any(isinstance(v, CallFailed) and v.worker_lost for _, v in out):
            self.check_scheduler()
            self.refresh()
        return out

    def check_scheduler(self) -> None:
        """:class:`SchedulerLost` once the client has lost its scheduler (it tries to
        reconnect meanwhile, but the workers that ran the trials closed with it)."""
        if self.client.status != "running":
            cluster_workers(self.client)  # raises, naming the scheduler

    def settle(
        self, publishing: Iterable[tuple[str, str]], on_wait: Callable[[], None] | None = None
    ) -> list[Published]:
        """Wait for the publishes deferred calls left running, each named (worker,
        token) by their outcomes; what each call's came to. A worker gone meanwhile took
        its publishes with it: they come back as errors."""
        answers: queue.Queue[Published] = queue.Queue()
        out: list[Published] = []
        asked = 0
        for worker, token in publishing:
            lost = Published(
                errors={("", token): f"worker {worker} was lost before its checkpoints were stored"}
            )
            runner = next((r for r in self.runners if r.worker == worker), None)
            if runner is None or worker in self._dead_workers:
                out.append(lost)
                continue
            try:
                future = runner.actor.settle(token)
            except RuntimeError:  # "Worker holding Actor was lost"
                out.append(lost)
                continue
            asked += 1
            self.client.loop.add_callback(self._deliver_settled, answers, future, lost)
        while asked:
            try:
                out.append(answers.get(timeout=WAIT_POLL_S))
                asked -= 1
            except queue.Empty:
                self.check_scheduler()
                if on_wait is not None:
                    on_wait()
        if any(p.errors for p in out):
            self.check_scheduler()  # publishes lost with the workers a lost scheduler took
        return out

    @staticmethod
    async def _deliver_settled(
        answers: queue.Queue[Published], future: Any, lost: Published
    ) -> None:
        value: Published
        try:
            value = await future
        except Exception as exc:  # the worker's connection closed under the call, say
            logger.debug("settling deferred publishes: %s: %s", type(exc).__name__, exc)
            value = lost
        answers.put(value)

    def _worker_died(self, worker: str) -> None:
        """First sight of ``worker``'s death: note which calls were running there, drop
        its runners (their slots wait for that worker: cancelled)."""
        if worker in self._running_at_death:
            return
        # workers that closed because their scheduler went: that is the one line to say
        self.check_scheduler()
        running = frozenset(c for c in self.started if self._calls[c].worker == worker)
        self._running_at_death[worker] = running
        logger.warning(
            "Dask worker %s died with %d segments running there; its trials go on from "
            "their checkpoints",
            worker,
            sum(self._sizes.get(c, 0) for c in running),
        )
        self._dead_workers.add(worker)
        # its other calls fail now: a call sent there after the death would only fail
        # when connecting to it times out (30 s); their own failures are ignored later
        for call, runner in self._calls.items():
            if runner.worker == worker:
                self._done.put((call, CallFailed(f"worker {worker} was lost (it died)", True)))
        lost = [r for r in self.runners if r.worker == worker]
        if lost:
            self.client.cancel([r.hold for r in lost])
        self.runners = [r for r in self.runners if r.worker != worker]

    def cancel(self) -> None:
        """Forget calls in flight (a runner finishes its current segment regardless)."""
        for runner in self._calls.values():
            runner.queued -= 1
        self._calls.clear()
        self._sizes.clear()
        self._exclusive.clear()
        self.started.clear()

    def _mark_started(self) -> None:
        """A runner runs its calls in order: the oldest one it still has is running (none
        on a dead worker: its calls wait for nothing)."""
        now = time.monotonic()
        heads: dict[int, int] = {}
        for call, runner in self._calls.items():
            if runner.worker not in self._dead_workers:
                heads.setdefault(id(runner), call)  # dicts keep submission order
        for call in heads.values():
            self.started.setdefault(call, now)

    def discard_parked(self, worker: str, tokens: list[str]) -> None:
        """Drop trainables parked on ``worker`` (an actor call: the driver does not wait
        for it, and a worker that is gone took them with it)."""
        runner = next((r for r in self.runners if r.worker == worker), None)
        if runner is None or worker in self._dead_workers:
            return
        with contextlib.suppress(RuntimeError):  # its worker was lost meanwhile: all gone
            runner.actor.discard(tokens)

    def worker_of(self, call: int) -> str | None:
        runner = self._calls.get(call)
        return runner.worker if runner else None

    def restart_worker(self, worker: str) -> None:
        """End a worker's process (its calls then fail as lost, its parked trainables
        are gone); its nanny starts it again, as after any worker loss. An actor call,
        answered on the worker's event loop, which a hung segment does not block."""
        runner = next((r for r in self.runners if r.worker == worker), None)
        if runner is None:
            return
        with contextlib.suppress(RuntimeError):  # gone already
            runner.actor.exit_process()

    def close(self) -> None:
        """Give the slots back: each hold task returns (a running segment finishes first;
        cancelling a running task would leave it in its thread, and distributed warns
        about each one still running when the cluster closes), then the actors go."""
        self.cancel()
        runners, self.runners = self.runners, []
        if not runners or self.client.status != "running":
            return
        try:
            for r in runners:
                r.actor.close()
            wait([r.hold for r in runners], timeout=CLOSE_WAIT_S)
        except Exception as e:  # a worker gone meanwhile: its hold ends with it
            logger.debug("closing the runners: %s", e)
        self.client.cancel([f for r in runners for f in (r.hold, r.future)])

"""One schedule, run: drivers on the simulated backend, one at a time, under a baton.

Each driver runs :func:`~popflow.flows.api.simulate.drive_simulated` in a thread of its
own over a :class:`~popflow.flows.simulation.faults.FaultStorage`; only the thread that
holds the baton runs, and the baton changes hands only at storage calls (a stall) and
when a driver ends. What runs next is decided in one place, :meth:`World.run`, from the
schedule alone, so a schedule replays exactly:

- the first driver starts the experiment;
- a driver that stalls is parked; the world lets its lease lapse on the virtual clock
  (or forces a takeover) and starts a new driver, which resumes the experiment;
- when a driver ends, the newest parked driver wakes and goes on from its stalled call
  (until it stops: it lost its lease); with none parked, an experiment not yet finished
  is resumed by a new driver (a crash, a failure, a stale driver's stop), a held lease
  waited out first;
- when a driver ends and the experiment is finished but the world goes on (a parked
  driver wakes, or a new one starts after a stale one stopped), a reader looks at the
  experiment first (``look``): what a stale driver wrote on top of a finished
  experiment shows there, before a later resume repairs it;
- a ``stall_segment`` stops the worker of the driver's next segment call
  (:class:`~popflow.flows.simulation.stalled_segments.StallingBackend`); the stale call
  wakes once the driver has committed its trials' new attempts, or when the driver ends;
- at most :data:`MAX_DRIVERS` drivers and :data:`MAX_CALLS` storage calls each: past
  either, the schedule fails as "did not end".

The driver's own helper work runs inline in its thread
(:mod:`popflow.infra.helper_threads`) and its lease renews inline
(:class:`~popflow.flows.backends.simulated.VirtualLease`): no other thread makes a call.
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from popflow.flows.api.simulate import drive_simulated
from popflow.flows.driver.clock import VirtualClock
from popflow.flows.simulation.faults import (
    DEATHS,
    Fault,
    FaultStorage,
    Schedule,
    SimulatedCrash,
)
from popflow.flows.simulation.stalled_segments import StallingBackend
from popflow.flows.spec.run_spec import RunSpec
from popflow.infra.storage import local_files
from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import (
    CHECKPOINT_PREFIX,
    COMMITS,
    LEASE_DIR,
    MANIFEST,
    is_scratch,
    lease_path,
)
from popflow.infra.store.lease import LeaseHeldError, LeaseLost, lease_epochs

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Drivers one schedule may start (the first, resumers, takeovers)
MAX_DRIVERS = 12
#: Storage calls one driver may make before it counts as never ending
MAX_CALLS = 5000
#: Tries to take a lease that is held before a schedule counts as locked out
MAX_HELD = 3
#: Real seconds a thread waits for the baton before the world says it deadlocked
WATCHDOG_S = 60.0
#: Virtual seconds a DELAY fault takes
DELAY_S = 3.0
#: Calls that change what is stored
WRITES = frozenset(
    {
        "write",
        "create",
        "append",
        "truncate",
        "adopt",
        "upload",
        "rename",
        "copy",
        "remove",
        "mkdir",
    }
)


#: Calls inside which a STALL_INSIDE parks the driver: a local log's append, its adoption
INSIDE_OPS = frozenset({"append", "adopt"})

#: A STALL_INSIDE in progress: what the next log write in this thread does first
_inside = threading.local()
#: the local byte writer the derived logs use
_write_all: Callable[[int, bytes], None] = getattr(
    local_files.write_all, "__wrapped__", local_files.write_all
)


def _write_after_stall(fd: int, data: bytes) -> None:
    """The logs' byte writer, that first parks the driver when a STALL_INSIDE is due."""
    stall = getattr(_inside, "stall", None)
    if stall is not None:
        _inside.stall = None
        stall()
    _write_all(fd, data)


# The seam a STALL_INSIDE stops at: every byte of a derived log written on local disk (an
# append past its fence check; an adoption's copy, before it is renamed over the log) goes
# through local_files.write_all. Wrapped once, for every thread; the wrapper does nothing
# unless this thread's driver is due to stall.
_write_after_stall.__wrapped__ = _write_all  # type: ignore[attr-defined]
local_files.write_all = _write_after_stall


class Runaway(BaseException):
    """A driver made more than :data:`MAX_CALLS` storage calls."""


class Deadlock(RuntimeError):
    """No thread got the baton within :data:`WATCHDOG_S` real seconds."""


@dataclass
class Driver:
    """One simulated driver process."""

    number: int
    world: World
    resume: bool | str
    force: bool = False
    calls: int = 0
    dead: bool = False
    parked: bool = False
    #: how it ended: finished, crashed, lost (LeaseLost), held (LeaseHeldError), failed
    #: (the injected StorageError), error (anything else), runaway
    outcome: str | None = None
    error: BaseException | None = None
    thread: threading.Thread | None = None
    backend: StallingBackend | None = None

    @property
    def written(self) -> dict[str, float]:
        return self.world.written

    def call(self, storage: FaultStorage, op: str, path: str, run: Callable[[], T]) -> T:
        world = self.world
        if self.dead:
            raise SimulatedCrash(f"driver {self.number} is dead")
        if world.intercepting is not self:  # a call the world itself makes (a plant)
            return run()
        self.calls += 1
        if self.calls > MAX_CALLS:
            self.dead = True
            raise Runaway(f"driver {self.number} made more than {MAX_CALLS} storage calls")
        index = world.calls
        world.calls += 1
        world.trace.append((index, self.number, op, world.relative(path)))
        if op in WRITES and not world.inside(path):
            world.outside.append(f"driver {self.number} {op} {path}")
        fault = world.faults.get(index)
        if fault is Fault.STALL_INSIDE and op in INSIDE_OPS and storage.is_local:
            world.fired.append((index, fault))
            _inside.stall = lambda: world.stall(self, force=False)
            try:
                out = run()  # a fence that refuses the call raises before any byte: no stall
            finally:
                stalled = _inside.stall is None
                _inside.stall = None
            if not stalled:  # it wrote no bytes (an adoption of a log that is not there)
                world.stall(self, force=False)
            world.wrote(self, op, path, out)
            return out
        if fault is not None:
            world.fired.append((index, fault))
            if fault is Fault.STALL_SEGMENT and self.backend is not None:
                self.backend.stall_next()
            world.apply(self, fault, storage)
            if fault is Fault.FAIL:
                raise StorageError(op, storage._url_of(path), "injected failure (simulated)")
            if fault is Fault.CRASH:
                self.dead = True
                raise SimulatedCrash(f"driver {self.number} died before {op} {path}")
            if fault is Fault.TORN and op == "append" and storage.appending is not None:
                target, data = storage.appending
                world.raw_append(target, data[: len(data) // 2])
                self.dead = True
                raise SimulatedCrash(f"driver {self.number} died inside an append to {path}")
        out = run()
        if op in WRITES:
            world.wrote(self, op, path, out)
        if fault in DEATHS:
            self.dead = True
            raise SimulatedCrash(f"driver {self.number} died after {op} {path}")
        return out


@dataclass
class World:
    """Drivers, their shared virtual clock and baton, and what they did to storage.

    ``spec_of(storage)``: the run's spec over a driver's (fault) storage; ``root``: the
    storage the experiment lives in (``root/<name>``).
    """

    schedule: Schedule
    root: Storage
    spec_of: Callable[[Storage], RunSpec]
    name: str
    lease_ttl: float
    clock: VirtualClock = field(default_factory=VirtualClock)
    calls: int = 0
    trace: list[tuple[int, int, str, str]] = field(default_factory=list)
    fired: list[tuple[int, Fault]] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    written: dict[str, float] = field(default_factory=dict)
    #: commits as they were created: (seq, epoch, driver)
    commits: list[tuple[int, int, int]] = field(default_factory=list)
    drivers: list[Driver] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    intercepting: Driver | None = None
    #: the invariants a reader of the experiment finds broken now (given the driver that
    #: just ended): asked when a driver ends with the experiment finished and the world
    #: goes on, its answers kept as problems
    look: Callable[[Driver], list[str]] | None = None
    _baton: int | None = None  # the driver number that may run; None: the world
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stalled: list[Driver] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.faults = self.schedule.at()
        self.experiment = self.root.child(self.name)
        self.slots = self.schedule.scenario.slots

    # -- paths ---------------------------------------------------------------
    def inside(self, path: str) -> bool:
        """Under the storage the run was given (a run that is no resume may start a new
        experiment beside the old one, ``<name>_2``)."""
        return path.startswith(self.root.root + "/") and not path.startswith(
            self.root.path("other") + "/"
        )

    def relative(self, path: str) -> str:
        if path == self.experiment.root or path.startswith(self.experiment.root + "/"):
            return posixpath.relpath(path, self.experiment.root)
        return path

    # -- what drivers did ------------------------------------------------------
    def wrote(self, driver: Driver, op: str, path: str, out: Any) -> None:
        self.written[path] = self.clock.time()
        rel = self.relative(path)
        if op == "create" and out is True and rel.startswith(COMMITS + "/"):
            first = self.experiment.read_text(rel).split("\n", 1)[0]
            record = json.loads(first)
            self.commits.append((int(record["seq"]), int(record["epoch"]), driver.number))
            if driver.backend is not None:  # what the new attempts made is committed
                driver.backend.wake()

    def raw_append(self, path: str, data: bytes) -> None:
        with open(path, "ab") as f:
            f.write(data)

    # -- faults that act on the world -----------------------------------------
    def apply(self, driver: Driver, fault: Fault, storage: FaultStorage) -> None:
        if fault is Fault.DELAY:
            self.clock.sleep(DELAY_S)
        elif fault in (Fault.STALL, Fault.STALL_FORCE, Fault.STALL_INSIDE):
            self.stall(driver, force=fault is Fault.STALL_FORCE)
        elif fault is Fault.FORGE_LEASE:
            newest = max(lease_epochs(self.experiment), default=0)
            forged = {"host": "elsewhere", "pid": 1, "epoch": newest + 1, "ttl": 1e300}
            path = lease_path(newest + 1)
            self.experiment.write_text(json.dumps({**forged, "expires": 1e300}), path)
            self.written[self.experiment.path(path)] = self.clock.time() - 3600.0
        elif fault is Fault.GARBLE_LEASE:
            self.experiment.write_text("{garbled", f"{LEASE_DIR}/99999999.json")
            self.written[self.experiment.path(f"{LEASE_DIR}/99999999.json")] = self.clock.time()
        elif fault is Fault.DAMAGE_CHECKPOINT:
            self._damage_newest_checkpoint()

    def _damage_newest_checkpoint(self) -> None:
        """Overwrite a data file of the checkpoint published last (by the world's record
        of renames and manifests; nothing if none was)."""
        found = [p for p in reversed(self.written) if posixpath.basename(p) == MANIFEST]
        found += [
            posixpath.join(p, MANIFEST)
            for p in reversed(self.written)
            if posixpath.basename(p).startswith(CHECKPOINT_PREFIX)
        ]
        for manifest in found:
            folder = posixpath.dirname(manifest)
            rel = self.relative(folder)
            if is_scratch(rel) or not self.experiment.exists(rel, MANIFEST):
                continue
            data = [n for n in self.experiment.listdir(rel) if n != MANIFEST]
            if data:
                old = self.experiment.read_bytes(rel, data[0])
                self.experiment.write_bytes(bytes(b ^ 0x5A for b in old) or b"x", rel, data[0])
                return

    # -- the baton -------------------------------------------------------------
    def _hand(self, to: int | None, me: int | None) -> None:
        """Give the baton to ``to`` and wait until it comes back to ``me``."""
        with self._cond:
            self._baton = to
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._baton == me, timeout=WATCHDOG_S):
                raise Deadlock(f"the baton never came back to {me} (it is with {self._baton})")

    def stall(self, driver: Driver, force: bool) -> None:
        """Park ``driver`` (its thread waits here) until the world wakes it."""
        driver.parked = True
        self._stalled.append(driver)
        self._next = ("stalled", force)
        self.intercepting = None
        self._hand(None, driver.number)
        self.intercepting = driver
        driver.parked = False

    def _start(self, resume: bool | str, force: bool = False) -> Driver:
        driver = Driver(len(self.drivers), self, resume, force)
        self.drivers.append(driver)
        driver.thread = threading.Thread(
            target=self._main, args=(driver,), name=f"simulated-driver-{driver.number}", daemon=True
        )
        driver.thread.start()
        return driver

    def _main(self, driver: Driver) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._baton == driver.number, timeout=WATCHDOG_S):
                driver.outcome = "deadlock"
                return
        self.intercepting = driver
        storage = FaultStorage.over(self.root, driver)
        backend = driver.backend = StallingBackend(self.slots, 1.0, clock=self.clock)
        try:
            drive_simulated(
                self.spec_of(storage), backend, resume=driver.resume, force_takeover=driver.force
            )
            driver.outcome = "crashed" if driver.dead else "finished"
        except SimulatedCrash:
            driver.outcome = "crashed"
        except Runaway as e:
            driver.outcome, driver.error = "runaway", e
        except LeaseLost as e:
            driver.outcome, driver.error = "lost", e
        except LeaseHeldError as e:
            driver.outcome, driver.error = "held", e
        except StorageError as e:
            driver.outcome, driver.error = "failed", e
        except BaseException as e:  # what a user would see: the schedule goes on, noted
            driver.outcome, driver.error = "error", e
        finally:
            if driver.dead and driver.outcome not in ("runaway",):
                driver.outcome = "crashed"
            self.intercepting = None
            self._next = ("ended", driver)
            with self._cond:
                self._baton = None
                self._cond.notify_all()

    def run(self, finished: Callable[[], bool]) -> None:
        """Run the schedule to its end (``finished``: whether the experiment has)."""
        self._next: tuple[str, Any] = ("start", None)
        held = 0
        while True:
            event, what = self._next
            if event == "start":
                driver = self._start(resume=False)
            elif event == "stalled":
                if len(self.drivers) >= MAX_DRIVERS:
                    driver = self._stalled.pop()  # no one else may start: it goes on
                else:
                    if not what:
                        self.clock.sleep(2 * self.lease_ttl + 1)  # its lease lapses
                    driver = self._start(resume="auto", force=what)
            else:  # a driver ended
                ended: Driver = what
                if ended.thread is not None:
                    ended.thread.join(WATCHDOG_S)
                if ended.backend is not None:  # its stopped workers wake, whatever it did
                    ended.backend.wake(all_of_them=True)
                held = held + 1 if ended.outcome == "held" else 0
                done = finished()
                last = done and ended.outcome == "finished" and not self._stalled
                if done and not last and self.look is not None:
                    self.problems += self.look(ended)  # what a reader sees before anyone repairs
                if self._stalled:
                    driver = self._stalled.pop()  # the newest parked one wakes
                elif last:
                    return
                elif held >= MAX_HELD:
                    self.problems.append(
                        f"locked out: {held} drivers in a row could not take the lease "
                        f"({ended.error})"
                    )
                    return
                elif len(self.drivers) >= MAX_DRIVERS:
                    self.problems.append(
                        f"did not end: {MAX_DRIVERS} drivers and still not finished "
                        f"(the last: {ended.outcome} {ended.error!r})"
                    )
                    return
                else:
                    if ended.outcome in ("crashed", "held", "runaway"):
                        self.clock.sleep(2 * self.lease_ttl + 1)  # its lease lapses
                    driver = self._start(resume="auto")  # as a user reruns it
            self._next = ("none", None)
            self._hand(driver.number, None)

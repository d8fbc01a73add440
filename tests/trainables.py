"""Trainables the integration tests run on Dask workers (importable by worker processes)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import flakyfs  # noqa: F401  (registers flaky:// with fsspec in every process that runs these)

from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report


class ParityTrainable(Trainable):
    """Ray's PBT synch test: ``mean_accuracy = iteration + a``, with ``a`` in the checkpoint."""

    def setup(self, config: dict[str, Any]) -> None:
        self.a = config["a"]

    def step(self) -> dict[str, Any]:
        return {"mean_accuracy": self.iteration + 1 + self.a, "a": self.a}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        # config "pad": that many bytes more in each checkpoint (a full-disk test fills up)
        pad = self.config.get("pad", 0)
        return {"a": self.a, "pad": b"x" * pad} if pad else {"a": self.a}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.a = checkpoint["a"]


def parity_function(config: dict[str, Any]) -> None:
    """The same as :class:`ParityTrainable`, written with the function API."""
    iteration, a = 0, config["a"]
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            iteration, a = json.load(f)
    while True:
        iteration += 1
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump([iteration, a], f)
            report(
                {"mean_accuracy": iteration + a, "a": a}, checkpoint=Checkpoint.from_directory(d)
            )


class FlakyTrainable(Trainable):
    """Raises at ``fail_at`` (once per marker file, if ``marker`` is set; else always)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.value = 0.0
        self.fail_at = config.get("fail_at")
        self.marker = config.get("marker")

    def step(self) -> dict[str, Any]:
        if self.iteration + 1 == self.fail_at:
            if self.marker is None:
                raise RuntimeError(f"boom at iteration {self.fail_at}")
            if not os.path.exists(self.marker):
                open(self.marker, "w").close()
                raise RuntimeError("transient boom")
        self.value += 1.0
        return {"score": self.value}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"value": self.value}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.value = checkpoint["value"]


class NoCheckpointTrainable(Trainable):
    def step(self) -> dict[str, Any]:
        return {"score": float(self.iteration)}


class EndsEarlyTrainable(ParityTrainable):
    """ParityTrainable that reports ``done`` at iteration ``config["done_at"]`` (if set)."""

    def step(self) -> dict[str, Any]:
        result = super().step()
        result["done"] = self.iteration + 1 == self.config.get("done_at")
        return result


class ConfigEcho(Trainable):
    """Reports its config's ``c`` and scores ``c`` per iteration (state: the running score)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.total = 0.0

    def step(self) -> dict[str, Any]:
        self.total += self.config["c"]
        return {"score": self.total, "c": self.config["c"]}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"total": self.total}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.total = checkpoint["total"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.resets = getattr(self, "resets", 0) + 1
        return True


class WorkerKiller(ParityTrainable):
    """ParityTrainable that SIGKILLs its own worker process once, mid-segment, at ``kill_at``."""

    def step(self) -> dict[str, Any]:
        marker = self.config.get("marker")
        if (
            self.iteration + 1 == self.config.get("kill_at")
            and marker
            and not os.path.exists(marker)
        ):
            open(marker, "w").close()
            os.kill(os.getpid(), 9)
        return super().step()


class SetupCountingTrainable(ParityTrainable):
    """ParityTrainable that leaves one file in ``config["setups"]`` per ``setup`` call."""

    def setup(self, config: dict[str, Any]) -> None:
        super().setup(config)
        fd, _ = tempfile.mkstemp(dir=config["setups"], prefix=f"{self.trial_id}-")
        os.close(fd)


class StopOnlyOnTheDriver:
    """A stop condition that cannot be unpickled in any process but the one that made it."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return result["training_iteration"] >= 3

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpickle_in, (self.pid,))


def _unpickle_in(pid: int) -> StopOnlyOnTheDriver:
    if os.getpid() != pid:
        raise RuntimeError("this stop condition only unpickles where it was made")
    stop = StopOnlyOnTheDriver.__new__(StopOnlyOnTheDriver)
    stop.pid = pid
    return stop


class Misbehaving(ParityTrainable):
    """ParityTrainable that, at iteration ``config["at"]``, does ``config["how"]``:
    "exit" (sys.exit), "interrupt" (KeyboardInterrupt), "string" (reports its metric as
    a string), "hang" (a step that never returns), "fail" (raises, every time),
    "os_exit" (``os._exit(3)``: its worker process dies), "sigkill" (its process
    SIGKILLs itself); ``config["once"]``: a marker
    file, so that it misbehaves only the first time; ``config["times"]`` appends the
    wall time of each set-up (each attempt)."""

    def setup(self, config: dict[str, Any]) -> None:
        super().setup(config)
        if config.get("times"):
            with open(config["times"], "a") as f:
                f.write(f"{time.time()}\n")

    def step(self) -> dict[str, Any]:
        result = super().step()
        if self.iteration + 1 != self.config.get("at"):
            return result
        once = self.config.get("once")
        if once:
            if os.path.exists(once):
                return result
            open(once, "w").close()
        how = self.config["how"]
        if how == "os_exit":
            os._exit(3)
        if how == "sigkill":
            os.kill(os.getpid(), 9)
        if how == "exit":
            sys.exit(3)
        if how == "interrupt":
            raise KeyboardInterrupt
        if how == "string":
            result["mean_accuracy"] = "high"
        if how == "hang":
            threading.Event().wait()
        if how == "fail":
            raise RuntimeError("deterministic failure")
        return result


class SleepyTrainable(ParityTrainable):
    """ParityTrainable whose every step takes ``config["sleep"]`` seconds (a slow model)."""

    def step(self) -> dict[str, Any]:
        time.sleep(self.config.get("sleep", 0.0))
        return super().step()


def with_data(config: dict[str, Any], data: Any = None, scale: float = 1.0) -> None:
    """A function trainable for ``with_parameters``: scores the sum of ``data``."""
    for _ in range(2):
        report({"score": float(sum(data)) * scale * config["x"], "pid": os.getpid()})


class GatedTrainable(ParityTrainable):
    """ParityTrainable that stops at iteration ``config["gate_at"]`` until the file
    ``config["gate"]`` exists, after creating ``<gate>.reached``: a test kills the
    driver there, mid-round, at a known point."""

    def step(self) -> dict[str, Any]:
        gate = self.config["gate"]
        if self.iteration + 1 == self.config["gate_at"] and not os.path.exists(gate):
            with open(gate + ".reached", "w"):
                pass
            while not os.path.exists(gate):
                time.sleep(0.05)  # a file the test creates; nothing else to wait on
        return super().step()


def forgetful_function(config: dict[str, Any]) -> None:
    """A function trainable that never checkpoints (``mean_accuracy`` = iteration) and
    raises once at ``config["fail_at"]`` (marker file ``config["once"]``)."""
    iteration = 0
    while True:
        iteration += 1
        if iteration == config["fail_at"] and not os.path.exists(config["once"]):
            open(config["once"], "w").close()
            raise RuntimeError("transient failure")
        report({"mean_accuracy": float(iteration)})


class WhereTrainable(GatedTrainable):
    """GatedTrainable whose results say where they ran (``cwd``: each test worker runs in
    a folder of its own), each step taking ``config["sleep"]`` seconds."""

    def step(self) -> dict[str, Any]:
        time.sleep(self.config.get("sleep", 0.0))
        return {**super().step(), "cwd": os.getcwd()}


class HostTrainable(GatedTrainable):
    """GatedTrainable whose results say which Dask worker ran them (``worker``: its address,
    on a simulated host its own IP), each step taking ``config["sleep"]`` seconds."""

    def step(self) -> dict[str, Any]:
        from distributed import get_worker

        time.sleep(self.config.get("sleep", 0.0))
        return {**super().step(), "worker": get_worker().address}


class Drifting(Trainable):
    """``score`` grows by ``lr * (1 - lr)`` plus seeded noise each step; ``cost`` says what
    an iteration would take (seconds), for a simulated backend's clock."""

    def setup(self, config: dict[str, Any]) -> None:
        self.score = 0.0

    def step(self) -> dict[str, Any]:
        import numpy as np

        lr = self.config["lr"]
        self.score += lr * (1 - lr) + 0.01 * float(np.random.standard_normal())
        return {"score": self.score, "cost": 1.0 + 3.0 * lr}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"score": self.score}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.score = checkpoint["score"]


def trial_index(trial_id: str) -> int:
    """A fresh trial's index (its variant's position), from its id ``<prefix>_<index>``:
    what belongs to the trial itself, not to the config an exploit clones."""
    return int(trial_id.rsplit("_", 1)[1])


class ParityFailing(ParityTrainable):
    """:class:`ParityTrainable` whose trials raise at an iteration: ``fail_at`` maps a
    trial's index to it (a class attribute, set on a subclass)."""

    fail_at: dict[int, int] = {}

    def step(self) -> dict[str, Any]:
        if self.fail_at.get(trial_index(self.trial_id)) == self.iteration + 1:
            raise RuntimeError(f"boom at iteration {self.iteration + 1}")
        return super().step()


def objective(config: dict[str, Any], t: float) -> float:
    """Fixed score of a config at time t; rankings change over time."""
    import math

    return config["a"] * math.log1p(t) - config["b"] * math.sqrt(t) + config["c"]


class Objective(Trainable):
    """Reports ``score = objective(config, t)`` at iteration ``t``; a trial raises at its
    iteration in ``errors`` (by trial index; a class attribute, set on a subclass)."""

    errors: dict[int, float] = {}

    def step(self) -> dict[str, Any]:
        t = self.iteration + 1
        if self.errors.get(trial_index(self.trial_id)) == t:
            raise RuntimeError(f"boom at iteration {t}")
        return {"score": objective(self.config, t)}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {}  # the iteration is all its state, and the checkpoint keeps it

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        pass


def gain(config: dict[str, Any], iteration: int, index: int) -> float:
    """Reward per iteration: best at lr = 0.07 and many layers, plus fixed wiggles."""
    import math

    lr = config["lr"]
    return (
        1
        - 100 * (lr - 0.07) ** 2
        + 0.02 * config["layers"]
        + 0.01 * math.sin(1.7 * iteration + index)
    )


class Gaining(Trainable):
    """``score`` grows by ``reward(config, iteration, index)`` each iteration (``index``:
    the trial's own, not cloned with its config), with ``score`` in the checkpoint;
    ``reward`` is :func:`gain` unless a subclass sets another (a staticmethod)."""

    reward = staticmethod(gain)

    def setup(self, config: dict[str, Any]) -> None:
        self.score = 0.0

    def step(self) -> dict[str, Any]:
        iteration = self.iteration + 1
        self.score += self.reward(self.config, iteration, trial_index(self.trial_id))
        return {"score": self.score}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"score": self.score}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.score = checkpoint["score"]


def _uploads_held() -> threading.Event:
    """This process's held uploads may go on once set. Kept on the ``threading`` module:
    an earlier test may send this module to workers by value (cloudpickle), and a lock
    that a method named as a global would travel with it, which no pickle can take."""
    if not hasattr(threading, "_popflow_test_uploads_held"):
        threading._popflow_test_uploads_held = threading.Event()  # type: ignore[attr-defined]
    return threading._popflow_test_uploads_held  # type: ignore[attr-defined]


def _first_time(folder: str, name: str) -> bool:
    """True once per ``name`` across every process (a file made exclusively)."""
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class HeldUpload(ParityTrainable):
    """ParityTrainable whose checkpoint at iteration ``hold_at`` (the first one saved, in
    one process) is not uploaded until a segment of the next round in that process has
    seen it still publishing (the process's publish function waits for it, once). That
    segment writes ``<marks>/seen.json`` (what was publishing, and the round the storage
    had committed last), then ``then``: "release" the upload, or "kill" the process."""

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        from popflow.tasks import uploads

        saved = super().save_checkpoint(checkpoint_dir)
        if self.iteration == self.config["hold_at"] and _first_time(self.config["marks"], "held"):
            publish = uploads._publish_staged

            def held(*args: Any, **kwargs: Any) -> str:  # this checkpoint's, next
                uploads._publish_staged = publish
                _uploads_held().wait(60)
                return publish(*args, **kwargs)

            uploads._publish_staged = held
        return saved

    def step(self) -> dict[str, Any]:
        from popflow.infra.storage.folder import Storage
        from popflow.infra.store.commit_log import ExperimentLog
        from popflow.tasks import uploads

        marks = self.config["marks"]
        publishing = sorted(path for _, path in uploads._publishing)
        if self.iteration == self.config["hold_at"] and publishing and _first_time(marks, "seen"):
            storage = Storage(self.config["experiment"], self.config["options"])
            committed = ExperimentLog(storage).latest()["round"]
            with open(os.path.join(marks, "seen.json"), "w") as f:
                json.dump({"publishing": publishing, "committed_round": committed}, f)
            if self.config["then"] == "kill":
                os.kill(os.getpid(), 9)
            _uploads_held().set()
        return super().step()

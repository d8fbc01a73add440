"""The faults ``chaos.py`` injects and the checks it makes afterwards.

Processes: a crash driver (``tests/crash_driver.py``) runs in a process group
of its own, with its Dask workers; it is found, stopped and killed by its id.
Storage: the experiment's folder, read straight from disk (the chaos script
is no driver: it never takes the lease).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path.insert(0, TESTS)

from test_nothing_lost import damage  # noqa: E402

from popflow.infra.storage.folder import Storage  # noqa: E402
from popflow.infra.store.checkpoints import CheckpointError, verify_in_place  # noqa: E402
from popflow.infra.store.commit_log import DamagedCommit, ExperimentLog, decode_commit  # noqa: E402
from popflow.infra.store.layout import (  # noqa: E402
    MANIFEST,
    commit_path,
    commit_seqs,
    pruned_seqs,
)
from popflow.infra.store.lease import lease_holder  # noqa: E402

DRIVER = os.path.join(TESTS, "crash_driver.py")


class Driver:
    """One crash driver: its process (a group of its own), output in ``log``."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: str) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self) -> None:
        """SIGKILL the driver's process group (driver and workers) and reap the driver."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout: float) -> bool:
        """Wait for the driver to end; False if it still runs after ``timeout`` s."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


def stop(drivers: list[Driver]) -> list[str]:
    """SIGKILL what is left of every driver's process group; what outlived a driver
    that ended by itself (its workers, say)."""
    found = []
    for driver in drivers:
        gone = not driver.alive()
        if gone:  # a driver's workers may take a moment to exit after it
            with contextlib.suppress(TimeoutError):
                poll(lambda d=driver: not group_members(d.pid), None, timeout=10)
        left = group_members(driver.pid)
        if left and gone:
            found.append(f"processes {left} outlived their driver {driver.log}")
        if left or driver.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver.pid, signal.SIGKILL)
        driver.proc.wait()
    return found


def proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (state first); [] when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return []


def stopped(pid: int) -> bool:
    return (proc_stat(pid) or ["gone"])[0] == "T"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = proc_stat(int(name))
            if fields and fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(name))
    return out


def workers_of(pid: int) -> list[int]:
    """The driver's Dask worker processes: its children running spawn_main (forked by
    any of its threads, so found by their parent id, not /proc/<pid>/task/<pid>/children)."""
    out = []
    for child in group_members(pid):
        if int((proc_stat(child) or ["", "0"])[1]) != pid:
            continue
        with contextlib.suppress(OSError), open(f"/proc/{child}/cmdline", "rb") as f:
            if b"spawn_main" in f.read():
                out.append(child)
    return out


def poll(condition: Any, driver: Driver | None, timeout: float = 300.0) -> bool:
    """Poll ``condition()`` until true; False once ``driver`` (if given) ended first.
    Raises TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if driver is not None and not driver.alive():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"{condition} not met in {timeout} s")
        time.sleep(0.05)  # polling processes and storage, not synchronising on time
    return True


def commits(experiment: str) -> list[int]:
    """The experiment's commit numbers now (not the pruned ones, gone or tombstones)."""
    try:
        names = os.listdir(os.path.join(experiment, ".popflow", "commits"))
    except FileNotFoundError:
        return []
    pruned = set(pruned_seqs(names))
    return [n for n in commit_seqs(names) if n not in pruned]


def holder_pid(experiment: str) -> int | None:
    try:
        holder = lease_holder(Storage(experiment))
    except FileNotFoundError:
        return None
    return None if holder is None else holder.get("pid")


def fill_disk(mount: str, slack: int) -> str:
    """Fill the file system at ``mount`` with a filler file up to ``slack`` bytes free."""
    st = os.statvfs(mount)
    size = max(0, st.f_bavail * st.f_frsize - slack)
    filler = os.path.join(mount, "filler")
    # unbuffered: ENOSPC (the disk is full anyway) comes from a write, not from close
    with open(filler, "ab", buffering=0) as f, contextlib.suppress(OSError):
        for _ in range(size >> 16):
            f.write(b"\0" * (1 << 16))
        f.write(b"\0" * (size & 0xFFFF))
    return filler


def damage_newest_commit(experiment: str, rng: random.Random, damaged: set[int]) -> str | None:
    """Damage the newest commit (torn, garbled or edited) unless it or the one a resume
    falls back to is damaged already (two in a row stop a resume by design). Returns
    what was done, or None."""
    numbers = commits(experiment)
    if len(numbers) < 2 or damaged & set(numbers[-2:]):
        return None
    path = Path(experiment, commit_path(numbers[-1]))
    how = rng.choice(["truncated", "garbage", "empty-json", "edited"])
    before = path.read_bytes()
    damage(path, how)
    if path.read_bytes() == before:  # an edit found nothing to change
        how = "truncated"
        damage(path, how)
    with contextlib.suppress(DamagedCommit):
        decode_commit(path.read_bytes())
        return None  # still valid: not a damage
    damaged.add(numbers[-1])
    return f"commit {numbers[-1]} {how}"


def damage_a_checkpoint(experiment: str, rng: random.Random) -> str | None:
    """Flip a byte in a data file of the checkpoint a waiting trial restores from, one
    whose owner has an earlier checkpoint to fall back to. Its relative path, or None."""
    state = ExperimentLog(Storage(experiment)).latest()
    if state is None:
        return None
    owners = {t["dirname"]: t for t in state["trials"]}
    candidates = set()
    for trial in state["trials"]:
        restore = trial["restore"]
        if trial["status"] in ("TERMINATED", "ERROR") or not restore:
            continue
        owner = owners.get(restore.split("/")[0])
        iteration = trial["restore_iteration"]
        if owner and any(c["iteration"] < iteration for c in owner["checkpoints"]):
            candidates.add(restore)
    for restore in sorted(candidates, key=lambda _: rng.random()):
        folder = os.path.join(experiment, restore)
        files = (
            sorted(f for f in os.listdir(folder) if f != MANIFEST) if os.path.isdir(folder) else []
        )
        files = [f for f in files if os.path.getsize(os.path.join(folder, f))]
        if files:
            path = os.path.join(folder, rng.choice(files))
            with open(path, "r+b") as f:
                at = rng.randrange(os.path.getsize(path))
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ 0xFF]))
            return restore
    return None


def clones_by_trial(pbt_global: str) -> dict[int, set[tuple[int, int]]]:
    """Asynchronous PBT's logged exploits: per target trial index, (its iteration, the
    source's iteration); after one a trial's next result follows the source's."""
    out: dict[int, set[tuple[int, int]]] = {}
    for line in pbt_global.splitlines():
        target, _source, at, source_at = json.loads(line)[:4]
        out.setdefault(int(str(target).split("_")[0]), set()).add((at, source_at))
    return out


def iteration_gaps(result: dict) -> tuple[int, int]:
    """(lost, duplicated): iterations missing from a trial's logged history, and
    iterations logged again, apart from exploits' jumps (``clones_by_trial``)."""
    clones = clones_by_trial(result["pbt_global"])
    lost = duplicated = 0
    for dirname, rows in result["trials"].items():
        jumps = clones.get(int(dirname.rsplit("_", 1)[1]), set())
        iterations = [r["training_iteration"] for r in rows]
        lost += iterations[0] - 1 if iterations else 0
        for a, b in itertools.pairwise(iterations):
            if b == a + 1 or (a, b - 1) in jumps:
                continue
            if b > a + 1:
                lost += b - a - 1
            else:
                duplicated += a - b + 1
    return lost, duplicated


def unverified_checkpoints(experiment: str) -> list[str]:
    """The checkpoints the final commit names (restore points and kept ones) whose files
    do not match their manifests."""
    storage = Storage(experiment)
    final = ExperimentLog(storage).latest() or {"trials": []}
    named = {t["restore"] for t in final["trials"] if t["restore"]}
    named |= {f"{t['dirname']}/{c['name']}" for t in final["trials"] for c in t["checkpoints"]}
    bad = []
    for rel in sorted(named):
        try:
            verify_in_place(storage, rel)
        except CheckpointError:
            bad.append(rel)
    return bad


def fallbacks(output: str, checkpoint: str) -> str:
    """What a driver's output says it did with a damaged checkpoint."""
    for line in output.splitlines():
        if f"checkpoint {checkpoint} failed its check" in line:
            return "fell back to " + line.rsplit("falling back to ", 1)[-1].strip()
        if f"checkpoint {checkpoint} is corrupt and no earlier one exists" in line:
            return "no earlier checkpoint"
    return "not read"


def commit_fallbacks(output: str, damaged: dict[str, set[int]]) -> dict[str, str]:
    """What the drivers' output says of each damaged commit ("runN commit S")."""
    out = {}
    for exp, seqs in damaged.items():
        run = os.path.basename(os.path.dirname(exp))
        for seq in sorted(seqs):
            said = re.search(
                rf"commit {seq} of \S*/{run}/exp is damaged .*continuing from commit (\d+)", output
            )
            out[f"{run} commit {seq}"] = f"fell back to {said[1]}" if said else "not seen"
    return out


def last_error(output: str) -> str:
    """The last line of a driver's output that names an exception."""
    lines = [
        ln
        for ln in output.splitlines()
        if re.match(r"^[\w.]+(Error|Lost|Conflict|Exception)\b", ln)
    ]
    return lines[-1][:300] if lines else "(no exception line)"


def is_enospc(output: str) -> bool:
    return "StorageError" in output and os.strerror(errno.ENOSPC) in output

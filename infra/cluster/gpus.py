"""Which GPUs a trial sees: devices per worker, per trial slot, and ``CUDA_VISIBLE_DEVICES``.

As in Ray, a trial that asks for GPUs sees only its own: one device per trial for
``gpu: 1``, two for ``gpu: 2``, and one device shared by the trials that split it
for ``gpu: 0.5``. ``CUDA_VISIBLE_DEVICES`` is read once per process, when CUDA
starts, so it can pin a trial only if its worker process runs no GPU trial on
another device: the embedded cluster starts one worker process per device group
(as dask-cuda's ``LocalCUDACluster`` does), and a worker of the user's own that
offers several GPUs in one process is warned about (:func:`shared_process_warning`).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Sequence

#: The environment variable CUDA (and so torch, jax, cupy) reads for the devices it uses.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


def detect_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES``'s if set, else ``nvidia-smi -L``'s
    (0 without it)."""
    visible = os.environ.get(CUDA_VISIBLE_DEVICES)
    if visible is not None:
        return len(parse_devices(visible))
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def parse_devices(value: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES``'s devices (indices or ``GPU-<uuid>``s), in order.

    >>> parse_devices("2, 3")
    ['2', '3']
    >>> parse_devices("")
    []
    """
    return [d.strip() for d in value.split(",") if d.strip()]


def visible_devices(count: int) -> list[str]:
    """The ``count`` devices this process hands out: its own ``CUDA_VISIBLE_DEVICES``
    (a user's restriction, or a worker's pinning), else ``0 .. count-1``."""
    visible = os.environ.get(CUDA_VISIBLE_DEVICES)
    devices = parse_devices(visible) if visible is not None else [str(i) for i in range(count)]
    return devices[:count] if count else devices


def slot_devices(devices: Sequence[str], slot: int, trial_gpu: float) -> tuple[str, ...]:
    """The devices trial slot ``slot`` of a worker with ``devices`` uses.

    ``gpu >= 1``: ``ceil(gpu)`` devices of its own; ``gpu < 1``: slots share a
    device, ``floor(1 / gpu)`` to each, as Ray packs fractional GPU trials.

    >>> [slot_devices(["0", "1"], s, 1.0) for s in (0, 1)]
    [('0',), ('1',)]
    >>> [slot_devices(["0", "1"], s, 0.5) for s in range(4)]
    [('0',), ('0',), ('1',), ('1',)]
    >>> slot_devices(["4", "5", "6", "7"], 1, 2.0)
    ('6', '7')
    """
    if trial_gpu >= 1:
        k = math.ceil(trial_gpu)
        return tuple(devices[slot * k : (slot + 1) * k])
    per_device = max(1, math.floor(1 / trial_gpu + 1e-9))
    index = slot // per_device
    return (devices[index],) if index < len(devices) else ()


def shared_process_warning(worker: str, slots: int, nthreads: int, trial_gpu: float) -> str | None:
    """Why ``CUDA_VISIBLE_DEVICES`` cannot pin the GPU trials of ``worker``, if it cannot:
    its one process runs ``slots`` trials on different devices."""
    if trial_gpu < 1 and slots <= max(1, math.floor(1 / trial_gpu + 1e-9)):
        return None  # they share one device: one setting fits them all
    if slots <= 1 or nthreads <= 1:
        return None
    return (
        f"Dask worker {worker} runs {slots} GPU trials on different devices in one "
        "process; CUDA_VISIBLE_DEVICES is read once per process, so they may all use "
        "the first trial's devices. Start one worker process per GPU (`dask worker "
        "--nworkers N --nthreads 1` with each pinned, or dask-cuda's `dask cuda worker`)"
    )

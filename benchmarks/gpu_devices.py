"""On a GPU machine: does each GPU trial see only its device, as the docs promise?

Runs on popflow's embedded default (a local Prefect server, a local Dask cluster that
pins its workers to the GPUs it finds) a function trainable that reports what it sees:
``CUDA_VISIBLE_DEVICES``, ``torch.cuda.device_count()``, the device's name, and the
result of a matrix product on it. Two trials ask ``gpu: 1`` each, then four ask
``gpu: 0.5``; every trial must see exactly one device, and on a one-GPU machine the
halves share it two at a time. Then ``examples/pytorch_cnn.py --smoke-test
--gpus-per-trial 0.5`` must train on CUDA. Prints one JSON line of what each trial saw.

    python benchmarks/gpu_devices.py        # exits 1 if a check fails
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from popflow import tune

ROOT = Path(__file__).resolve().parent.parent


def what_i_see(config: dict[str, Any]) -> None:
    import torch

    seen = {
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "count": torch.cuda.device_count(),
        "name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "pid": os.getpid(),
    }
    if torch.cuda.is_available():
        a = torch.ones(512, 512, device="cuda")
        seen["product_ok"] = bool((a @ a)[0, 0].item() == 512.0)
    tune.report({"score": 1.0, **seen})


def run(gpu: float, trials: int, storage: str) -> list[dict[str, Any]]:
    tuner = tune.Tuner(
        tune.with_resources(what_i_see, {"cpu": 1, "gpu": gpu}),
        param_space={"i": tune.grid_search(list(range(trials)))},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name=f"gpu_{gpu}", storage_path=storage, verbose=0),
    )
    return [r.metrics for r in tuner.fit()]


def main() -> int:
    failures: list[str] = []
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="popflow-gpu-") as storage:
        for gpu, trials in ((1.0, 2), (0.5, 4)):
            seen = run(gpu, trials, storage)
            report[f"gpu={gpu}"] = [
                {k: m.get(k) for k in ("visible", "count", "name", "pid", "product_ok")}
                for m in seen
            ]
            for m in seen:
                if m.get("count") != 1 or not m.get("product_ok"):
                    failures.append(f"gpu={gpu}: a trial saw {m.get('count')} devices: {m}")
        cnn = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "pytorch_cnn.py"), "--smoke-test",
             "--gpus-per-trial", "0.5", "--storage", storage],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        report["pytorch_cnn_rc"] = cnn.returncode
        devices = set()
        for path in Path(storage, "pytorch_cnn").glob("*/result.json"):
            for line in path.read_text().splitlines():
                devices.add(json.loads(line).get("device"))
        report["pytorch_cnn_devices"] = sorted(d for d in devices if d)
        if cnn.returncode != 0 or devices != {"cuda"}:
            failures.append(
                f"pytorch_cnn: rc {cnn.returncode}, devices {devices}\n{cnn.stderr[-3000:]}"
            )
    print(json.dumps(report))
    for failure in failures:
        print("FAILED:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

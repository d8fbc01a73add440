"""What an offline Weights & Biases run recorded, read back from its ``run-<id>.wandb``
file (W&B's record log: a 7-byte header, then LevelDB's log format of 32 KiB blocks
holding protobuf ``Record``s), for tests that check what popflow logged."""

from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # ":W&B", a 2-byte magic number, a version byte
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    run_id: str
    name: str = ""
    group: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None
    artifacts: list[str] = field(default_factory=list)  # names of the logged artifacts


def payloads(data: bytes) -> list[bytes]:
    """The records' payloads of a LevelDB log (after the file header)."""
    out, pending, pos = [], b"", HEADER
    while pos + 7 <= len(data):
        left = BLOCK - (pos % BLOCK)
        if left < 7:  # the block's trailer is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
        elif kind == 0 and length == 0:
            pos += BLOCK - (pos % BLOCK) if pos % BLOCK else 0
    return out


def read_run(run_dir: str) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    with open(path, "rb") as f:
        data = f.read()
    run = OfflineRun(run_id=os.path.basename(path)[4:-6])
    for payload in payloads(data):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.name, run.group = record.run.display_name, record.run.run_group
            for item in record.run.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in record.config.update:
                run.config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            run.history.append(row)
        elif kind == "artifact":
            run.artifacts.append(record.artifact.name)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def offline_runs(wandb_dir: str, group: str) -> dict[str, OfflineRun]:
    """The offline runs of ``group`` under ``wandb_dir`` (``WANDB_DIR``), by run id. W&B
    reads ``WANDB_DIR`` once a process, so tests share one and tell runs by group."""
    runs = [read_run(d) for d in glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*"))]
    return {r.run_id: r for r in runs if r.group == group}

"""What must hold after every schedule, as a reader of the experiment folder sees it.

- **exactly once**: each trial's ``result.json`` holds iterations ``1..n`` once each,
  ``progress.csv`` the same ``n`` rows, and ``n`` is what the last commit counts;
- **one writer**: commits were created in epoch order: no driver committed after a
  newer driver's commit (epochs never go down, in the order commits were created);
- **inside**: no driver wrote or deleted anything outside the experiment folder, and
  a file beside it is as it was;
- **identical**: a synchronous run (PBT synch, HyperBand, a searcher's FIFO) ends with
  the trials, committed configs, statuses, results and exploit log of an undisturbed run;
- **params**: a trial's ``params.json`` holds the config it started with (Ray's), the
  config of its first result;
- **ends**: the experiment finished, within the drivers and calls the world allows
  (:mod:`popflow.flows.simulation.world` notes it when not).

:func:`outcome` reads the folder; :func:`violations` compares.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from popflow.flows.experiment.trial_logs import lines_of
from popflow.flows.experiment.trial_table import is_finished
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import manifest_digest, read_manifest, verify_in_place
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import GLOBAL_POLICY, PARAMS, PROGRESS, RESULTS, policy_file
from popflow.tasks.progress import VOLATILE_FIELDS


def _read(storage: Storage, *parts: str) -> str:
    try:
        return storage.read_text(*parts)
    except FileNotFoundError:
        return ""


def outcome(experiment: Storage) -> dict[str, Any]:
    """The experiment as a reader sees it: the last commit's trials, each with its config
    (``params.json``), status, committed result count, ``result.json`` rows (without the
    fields that differ between identical runs) and ``progress.csv``'s iterations; the
    exploit log; whether it finished."""
    latest = ExperimentLog(experiment).latest()
    trials: dict[str, Any] = {}
    for t in (latest or {}).get("trials", []):
        d = t["dirname"]
        rows = [json.loads(line) for line in _read(experiment, d, RESULTS).splitlines() if line]
        table = list(csv.DictReader(io.StringIO(_read(experiment, d, PROGRESS))))
        params = _read(experiment, d, PARAMS)
        trials[d] = {
            "config": json.loads(params) if params else None,
            "status": t["status"],
            "committed": t["num_results"],
            "committed_config": t["config"],
            "rows": [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in rows],
            "csv_iterations": [int(r.get("training_iteration") or 0) for r in table],
        }
    return {
        "finished": latest is not None and is_finished(latest),
        "trials": trials,
        "policy": [json.loads(line) for line in _read(experiment, GLOBAL_POLICY).splitlines()],
    }


def kept(experiment: Storage) -> list[str]:
    """**kept**: every checkpoint the last commit names, and each trial's restore, is there
    and matches its manifest (a stalled driver once deleted a checkpoint its successor
    committed); each ``pbt_policy_<trial_id>.txt`` holds the committed lineage."""
    latest = ExperimentLog(experiment).latest()
    out = []
    for t in (latest or {}).get("trials", []):
        named = {f"{t['dirname']}/{c['name']}": c.get("digest") for c in t["checkpoints"]}
        if t.get("restore"):
            named.setdefault(t["restore"], None)
        for path, digest in named.items():
            try:
                verify_in_place(experiment, path)
                # the version the commit names, not another driver's of the same name
                if digest and manifest_digest(read_manifest(experiment, path)) != digest:
                    out.append(f"kept: {path} is not the version the last commit names")
            except Exception as e:  # missing, half-published or changed: all findings
                out.append(f"kept: {path}, named by the last commit: {type(e).__name__}: {e}")
        want = lines_of(t["lineage"]) if t.get("lineage") else ""
        if _read(experiment, policy_file(t["trial_id"])) != want:
            out.append(f"kept: {policy_file(t['trial_id'])} is not the committed lineage")
    return out


def violations(
    seen: dict[str, Any],
    commits: list[tuple[int, int, int]],
    reference: dict[str, Any] | None,
) -> list[str]:
    """Each invariant ``seen`` breaks (one line each); ``commits``: (seq, epoch, driver)
    as they were created; ``reference``: an undisturbed run's :func:`outcome` (None: the
    run need not be identical to one)."""
    out = []
    if not seen["finished"]:
        out.append("ends: the experiment did not finish")
    for d, t in seen["trials"].items():
        iterations = [r.get("training_iteration") for r in t["rows"]]
        if iterations != list(range(1, len(iterations) + 1)):
            out.append(f"exactly once: {d}/{RESULTS} has iterations {iterations}")
        if t["csv_iterations"] != iterations:
            out.append(
                f"exactly once: {d}/{PROGRESS} has iterations {t['csv_iterations']}, "
                f"{RESULTS} {iterations}"
            )
        first = t["rows"][0].get("config") if t["rows"] else None
        if first is not None and t["config"] != first:
            out.append(f"params: {d}/{PARAMS} holds {t['config']}, its first result {first}")
        if len(iterations) != t["committed"]:
            out.append(
                f"exactly once: {d} has {len(iterations)} results, its commit {t['committed']}"
            )
    newest = 0
    for seq, epoch, driver in commits:
        if epoch < newest:
            out.append(
                f"one writer: commit {seq} by driver {driver} (epoch {epoch}) after a commit "
                f"of epoch {newest}"
            )
        newest = max(newest, epoch)
    if reference is not None:
        mine, theirs = _comparable(seen), _comparable(reference)
        if mine != theirs:
            out.append(f"identical: {_first_difference(mine, theirs)}")
    return out


def _comparable(seen: dict[str, Any]) -> dict[str, Any]:
    return {
        "trials": {
            d: {k: t[k] for k in ("committed_config", "status", "rows")}
            for d, t in seen["trials"].items()
        },
        "policy": seen["policy"],
    }


def _first_difference(mine: Any, theirs: Any, where: str = "") -> str:
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in sorted(set(mine) | set(theirs), key=str):
            if mine.get(key) != theirs.get(key):
                return _first_difference(mine.get(key), theirs.get(key), f"{where}/{key}")
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if a != b:
                return _first_difference(a, b, f"{where}[{i}]")
    return f"{where or '/'}: {_short(mine)} where an undisturbed run has {_short(theirs)}"


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) < 300 else text[:300] + "..."

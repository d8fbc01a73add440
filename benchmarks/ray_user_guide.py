"""Ray Tune's user guide on popflow: the snippets of ``tests/ray_user_guide/`` with only their
import lines changed, each a fresh process, and (``--side ray`` or ``both``) the same snippets
on Ray itself, unchanged.

The corpus and where each snippet comes from: ``tests/ray_user_guide/README.md``; which
snippets run here and what Ray itself does with each: its ``catalogue.tsv``. The imports are
rewritten by :func:`ray_examples.rewrite` (``from ray import tune`` -> ``from popflow import
tune``, ``import ray`` -> ``import popflow as ray``); nothing else of a snippet changes.

popflow runs on the embedded default (no ``PREFECT_API_URL``; popflow's local server in one
``PREFECT_HOME`` the runs share, started by the first run and stopped by its PID at the end).
Each run has its own working folder, which is also its ``HOME``. Ray runs with
``RAY_USAGE_STATS_ENABLED=0``.

    .venv/bin/python benchmarks/ray_user_guide.py                     # popflow, every runnable one
    .venv/bin/python benchmarks/ray_user_guide.py --side both --only 13,24
    .venv/bin/python benchmarks/ray_user_guide.py --side ray --all    # incl. those marked not runnable

The table printed at the end counts the snippets that exit 0 on each side; ``--json`` keeps
every run's rc, wall time and error line.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ray_examples as rx  # noqa: E402 (benchmarks/ is not a package)

CORPUS = HERE.parent / "tests" / "ray_user_guide"


@dataclass(frozen=True)
class Snippet:
    """One snippet of the corpus, as its catalogue row describes it."""

    id: str
    path: Path
    guide: str
    #: what keeps it from running here ("-": nothing; it runs in CI)
    needs: str
    #: what Ray 2.60 itself does with it ("runs", or why it fails)
    on_ray: str
    items: str

    @property
    def runnable(self) -> bool:
        return self.needs == "-"


def catalogue() -> list[Snippet]:
    """The corpus's snippets, in order (every file of ``snippets/`` has a row, and each row
    a file: :func:`check_catalogue`)."""
    rows = []
    with (CORPUS / "catalogue.tsv").open() as f:
        for row in csv.DictReader(f, delimiter="\t"):
            rows.append(
                Snippet(
                    id=row["id"],
                    path=CORPUS / "snippets" / row["file"],
                    guide=row["guide"],
                    needs=row["needs"],
                    on_ray=row["on_ray"],
                    items=row["items"],
                )
            )
    return rows


def check_catalogue(snippets: list[Snippet]) -> None:
    files = sorted(p.name for p in (CORPUS / "snippets").glob("*.py"))
    listed = sorted(s.path.name for s in snippets)
    if files != listed:
        raise SystemExit(f"catalogue.tsv and snippets/ differ: {set(files) ^ set(listed)}")


def source_for(snippet: Snippet, side: str) -> tuple[str, list[tuple[str, str]]]:
    """The snippet's text as ``side`` runs it (popflow: imports rewritten), and the lines
    that changed."""
    text = snippet.path.read_text()
    return rx.rewrite(text) if side == "popflow" else (text, [])


def run_snippet(snippet: Snippet, side: str, root: Path, home: Path, timeout: float) -> dict:
    """Run one snippet in a fresh process in its own folder; rc, wall and error line."""
    text, _ = source_for(snippet, side)
    cwd = root / side / snippet.id
    cwd.mkdir(parents=True, exist_ok=True)
    script = cwd / snippet.path.name
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(HOME=str(cwd), PYTHONUNBUFFERED="1")
    if side == "popflow":
        env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    else:
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        env.pop("RAY_ADDRESS", None)  # a fresh local Ray, as the guide's scripts start
    run = rx.run_example([sys.executable, script.name], env, cwd, timeout, cwd / "output.log")
    return {
        "id": snippet.id,
        "side": side,
        "rc": run["rc"],
        "wall_s": round(run["process_wall_s"], 2),
        "error": run.get("error"),
        "log": run["log"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=["popflow", "ray", "both"], default="popflow")
    parser.add_argument("--only", help="comma-separated snippet ids (01,13,...)")
    parser.add_argument("--all", action="store_true", help="also those marked not runnable here")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, help="write every run's record here")
    parser.add_argument("--root", type=Path, help="working folders (default: a temporary one)")
    args = parser.parse_args()

    snippets = catalogue()
    check_catalogue(snippets)
    if args.only:
        wanted = {s.strip().zfill(2) for s in args.only.split(",")}
        snippets = [s for s in snippets if s.id in wanted]
    elif not args.all:
        snippets = [s for s in snippets if s.runnable]
    sides = ["popflow", "ray"] if args.side == "both" else [args.side]
    root = args.root or Path(tempfile.mkdtemp(prefix="ray-user-guide-"))
    home = root / "prefect-home"
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        for snippet in snippets:
            for side in sides:
                record = run_snippet(snippet, side, root, home, args.timeout)
                records.append(record)
                mark = "ok " if record["rc"] == 0 else "FAIL"
                print(
                    f"{mark} {side:7} {snippet.path.stem:45} {record['wall_s']:7.1f} s  "
                    f"{'' if record['rc'] == 0 else record['error']}",
                    flush=True,
                )
    finally:
        if "popflow" in sides:
            rx.stop_prefect(home)
    for side in sides:
        mine = [r for r in records if r["side"] == side]
        ok = sum(r["rc"] == 0 for r in mine)
        print(f"{side}: {ok} of {len(mine)} exit 0")
    print(f"total wall {time.perf_counter() - started:.0f} s; logs under {root}")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()

"""Ray Tune's own example scripts on popflow, with only their import lines changed.

The scripts are read from the installed ``ray`` wheel (``ray/tune/examples/``,
found with importlib in the interpreter that has Ray), never copied into this
repository. Each is rewritten into a temporary folder, changing its import
lines only:

- ``from ray import tune`` -> ``from popflow import tune``, and ``from ray.X import Y``
  -> ``from popflow.X import Y`` generally;
- ``import ray`` -> ``import popflow as ray`` (``import ray.X as Y`` -> ``import popflow.X as Y``);
- ``from ray.tune.examples.X import Y`` -> ``from X import Y``: another of Ray's
  examples, whose rewritten copy lies next to the script.

Every run is a fresh subprocess in its own temporary working directory, which
is also its ``HOME`` (Ray writes ``~/ray_results``, popflow ``./results``), so
nothing lands in the user's home. A small launcher (``LAUNCHER``, run with
``python -c``) wraps ``Tuner.fit`` and ``tune.run`` of the library the script
imports, runs the script with ``runpy.run_path(..., run_name="__main__")`` and
at exit prints one ``RESULT_JSON`` line: the metric and mode of each ``fit()``,
the best trial's value (``get_best_result()``), the number of trials and of
errored trials, and ``fit()``'s own wall time. The script itself is not edited
beyond its imports.

popflow runs on its embedded default, as a user sees it: no ``PREFECT_API_URL``
(removed from the child's environment), popflow's local Prefect server. It
lives in one ``PREFECT_HOME`` shared by the popflow runs of this benchmark,
whose database and server a one-run warm-up creates and starts first (reported
separately), as for a user who has run popflow before; the server is stopped
by its PID at the end. ``--repeats N`` runs each side N times, alternately,
and reports the run of median wall. Ray runs with
``RAY_USAGE_STATS_ENABLED=0`` (no telemetry from an offline machine).

- default: each example with ``--smoke-test`` on popflow only: rc, process wall
  time, best metric, trials, errors and the last error line of a failed run;
- ``--side-by-side``: the same ``--smoke-test`` runs on popflow *and* the original
  script on Ray, alternately (process walls, their ratio, the best metric of each);
- ``--full``: each example on its full settings (no ``--smoke-test``) on popflow
  *and* the original script on Ray, alternately (popflow, then Ray, per
  example): process walls, their ratio and the best metric of each.

One interpreter with both popflow and Ray (the ``bench`` extra), or the project
venv for popflow and ``--ray-python`` for Ray (which also finds the examples):

    /tmp/bv/bin/python benchmarks/ray_examples.py                                  # ~3 min
    .venv/bin/python benchmarks/ray_examples.py --ray-python /tmp/bv/bin/python
    .venv/bin/python benchmarks/ray_examples.py --ray-python /tmp/bv/bin/python --full \\
        --only pbt_example,pbt_function,hyperband_function_example,\\
async_hyperband_example,custom_func_checkpointing,logging_example                  # ~9 min
    /tmp/bv/bin/python benchmarks/ray_examples.py --quick    # pbt_example, async_hyperband_example

On 2 cores two full runs take long on Ray: ``hyperband_example`` (200 trials)
ran past 400 s, and ``tune_basic_example`` (100 trials of 100 x 0.1 s) needs
at least 500 s a side; give them ``--timeout`` to match.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from common import (
    RESULT_PREFIX,
    RESULTS_DIR,
    loadavg,
    python,
    scratch_dir,
    table,
    write_json,
)

#: Ray 2.x's example scripts, in the order they run.
EXAMPLES = [
    "pbt_example",
    "pbt_function",
    "hyperband_example",
    "hyperband_function_example",
    "async_hyperband_example",
    "tune_basic_example",
    "custom_func_checkpointing",
    "logging_example",
    "pb2_example",
    "optuna_example",
    "optuna_define_by_run_example",
    "optuna_multiobjective_example",
    "xgboost_example",
    "lightgbm_example",
    "nevergrad_example",
    "hyperopt_conditional_search_space_example",
    "bayesopt_example",
    "custom_checkpointing_with_callback",
    "bohb_example",
    "mlflow_example",
    "xgboost_dynamic_resources_example",
]
#: What an example needs in its environment on popflow beyond a user's defaults
#: (``{cwd}``: its working directory): MLflow 3 refuses the file store Ray's
#: mlflow_example logs to (``tempfile.gettempdir()/mlruns``) unless allowed, and the
#: folder is the run's own (Ray's side: see :func:`side_env`).
EXAMPLE_ENV: dict[str, dict[str, str]] = {
    "mlflow_example": {"MLFLOW_ALLOW_FILE_STORE": "true", "TMPDIR": "{cwd}"},
}


def example_env(name: str, cwd: Path) -> dict[str, str]:
    """``EXAMPLE_ENV``'s variables for example ``name`` run in ``cwd``."""
    return {k: v.format(cwd=cwd) for k, v in EXAMPLE_ENV.get(name, {}).items()}


def side_env(name: str, side: str, cwd: Path) -> dict[str, str]:
    """:func:`example_env` for ``side``; Ray's without ``TMPDIR``: its sockets under a
    run's folder would outgrow AF_UNIX's 107-byte paths."""
    env = example_env(name, cwd)
    return env if side == "popflow" else {k: v for k, v in env.items() if k != "TMPDIR"}


#: The Ray release whose examples ``tests/test_ray_examples.py`` runs in CI (its wheel,
#: downloaded by pip, never installed) and ``--ray-version`` takes by default.
RAY_VERSION = "2.60.0"

#: ``--quick``: one PBT and one ASHA example.
QUICK = ["pbt_example", "async_hyperband_example"]

#: Run by ``python -c LAUNCHER <library> <script> [script arguments]``: wraps the
#: library's ``Tuner`` and ``tune.run``, runs the script as ``__main__`` and prints
#: what it found as one RESULT_JSON line at exit (also after an exception).
LAUNCHER = """
import atexit, importlib, json, os, runpy, sys, time, traceback

T0 = time.perf_counter()
LIBRARY, SCRIPT, *ARGS = sys.argv[1:]
STATE = {"library": LIBRARY, "fits": [], "error": None}


def _best(results, metric, mode):
    # a ResultGrid (Tuner.fit) or an ExperimentAnalysis (tune.run)
    if hasattr(results, "get_best_result"):
        best = results.get_best_result(metric, mode)
        return best.metrics, best.config
    trial = results.get_best_trial(metric, mode)
    return trial.last_result, trial.config


def _record(results, metric, mode, wall):
    entry = {"metric": metric, "mode": mode, "fit_wall_s": wall}
    try:
        trials = list(results) if hasattr(results, "get_best_result") else results.trials
        entry["trials"] = len(trials)
        if hasattr(results, "num_errors"):
            entry["errors"] = int(results.num_errors)
            errors = list(results.errors)
        else:
            errors = [t.error_file for t in trials if t.status == "ERROR"]
            entry["errors"] = len(errors)
        if errors:  # the first errored trial's last line
            lines = [ln for ln in str(errors[0]).splitlines() if ln.strip()]
            entry["trial_error"] = lines[-1].strip() if lines else repr(errors[0])
    except Exception as e:
        entry["count_error"] = f"{type(e).__name__}: {e}"
    try:
        metrics, config = _best(results, metric, mode)
        if metric is not None:
            entry["best"] = metrics.get(metric)
        entry["best_config"] = config
    except Exception as e:
        entry["best_error"] = f"{type(e).__name__}: {e}"
    STATE["fits"].append(entry)


def _wrap():
    tune = importlib.import_module(LIBRARY + ".tune")
    tuner_init, tuner_fit = tune.Tuner.__init__, tune.Tuner.fit

    def __init__(self, *args, **kwargs):
        tuner_init(self, *args, **kwargs)
        self._bench_tune_config = kwargs.get("tune_config")

    def fit(self):
        tc = getattr(self, "_bench_tune_config", None)
        start = time.perf_counter()
        results = tuner_fit(self)
        wall = time.perf_counter() - start
        _record(results, getattr(tc, "metric", None), getattr(tc, "mode", None), wall)
        return results

    tune.Tuner.__init__, tune.Tuner.fit = __init__, fit
    tune_run = getattr(tune, "run", None)
    if tune_run is not None:

        def run(*args, **kwargs):
            start = time.perf_counter()
            results = tune_run(*args, **kwargs)
            wall = time.perf_counter() - start
            _record(results, kwargs.get("metric"), kwargs.get("mode"), wall)
            return results

        tune.run = run


@atexit.register  # registered first, so it runs after the libraries' own shutdown
def _emit():
    STATE["launcher_wall_s"] = time.perf_counter() - T0
    print(PREFIX + json.dumps(STATE, default=str), flush=True)


_wrap()
sys.argv = [SCRIPT, *ARGS]
sys.path[0] = os.path.dirname(os.path.abspath(SCRIPT))  # as `python SCRIPT` would
rc = 0
try:
    runpy.run_path(SCRIPT, run_name="__main__")
except SystemExit as e:
    rc = e.code
    if rc not in (None, 0):
        STATE["error"] = f"SystemExit: {rc}"
except BaseException as e:
    traceback.print_exc()
    STATE["error"] = traceback.format_exception_only(type(e), e)[-1].strip()
    rc = 1
sys.exit(rc)
"""

_FROM = re.compile(r"^(\s*)from\s+ray((?:\.\w+)*)(\s+import\b.*)$")
_IMPORT = re.compile(r"^(\s*)import\s+ray((?:\.\w+)*)(\s+as\s+\w+)?(\s*(?:#.*)?)$")
_EXAMPLE = re.compile(r"^\.tune\.examples\.(\w+)$")


def rewrite_line(line: str) -> str:
    """One line of a Ray script with its ``ray`` imports pointed at popflow (others unchanged).

    >>> rewrite_line("from ray.tune.schedulers import PopulationBasedTraining")
    'from popflow.tune.schedulers import PopulationBasedTraining'
    >>> rewrite_line("import ray  # the cluster")
    'import popflow as ray  # the cluster'
    >>> rewrite_line("from ray.tune.examples.pbt_function import pbt_function")
    'from pbt_function import pbt_function'
    """
    if m := _FROM.match(line):
        indent, dotted, rest = m.groups()
        if e := _EXAMPLE.match(dotted):  # another example: its rewritten copy, alongside
            return f"{indent}from {e.group(1)}{rest}"
        return f"{indent}from popflow{dotted}{rest}"
    if m := _IMPORT.match(line):
        indent, dotted, alias, tail = m.groups()
        if alias:
            return f"{indent}import popflow{dotted}{alias}{tail}"
        if dotted:  # `import ray.tune` binds `ray`: bind popflow under that name too
            return f"{indent}import popflow{dotted}; import popflow as ray{tail}"
        return f"{indent}import popflow as ray{tail}"
    return line


def rewrite(source: str) -> tuple[str, list[tuple[str, str]]]:
    """``source`` with its import lines rewritten, and the (old, new) pairs changed."""
    lines = source.splitlines(keepends=True)
    changed = []
    out = []
    for line in lines:
        body = line.rstrip("\r\n")
        new = rewrite_line(body)
        if new != body:
            changed.append((body, new))
        out.append(new + line[len(body) :])
    return "".join(out), changed


def examples_dir(ray_python: str) -> Path:
    """``ray/tune/examples`` of the wheel installed for ``ray_python`` (Ray is not imported)."""
    code = (
        "import importlib.util, os; spec = importlib.util.find_spec('ray'); "
        "print(os.path.join(os.path.dirname(spec.origin), 'tune', 'examples'))"
    )
    out = subprocess.run(
        [ray_python, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    if out.returncode != 0:
        raise SystemExit(f"{ray_python} has no ray: {out.stderr.strip().splitlines()[-1:]}")
    path = Path(out.stdout.strip())
    if not path.is_dir():
        raise SystemExit(f"no examples folder in the ray wheel: {path}")
    return path


def examples_from_wheel(version: str, target: Path) -> Path:
    """``ray/tune/examples`` of Ray ``version``: pip downloads its wheel into ``target`` (no
    install, no dependencies) and its example scripts are unpacked beside it."""
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [python(), "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--only-binary=:all:", f"ray=={version}", "--dest", str(target)],
        check=True, timeout=600, capture_output=True,
    )  # fmt: skip
    [wheel] = target.glob(f"ray-{version}-*.whl")
    folder = "ray/tune/examples/"
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith(folder) and name.endswith(".py") and "/" not in name[len(folder) :]:
                z.extract(name, target)
    return target / folder


def write_rewritten(source_dir: Path, target: Path) -> dict[str, list[tuple[str, str]]]:
    """Rewrite every example module of ``source_dir`` into ``target``; the changes by name."""
    target.mkdir(parents=True, exist_ok=True)
    changes = {}
    for path in sorted(source_dir.glob("*.py")):
        text, changed = rewrite(path.read_text())
        (target / path.name).write_text(text)
        changes[path.stem] = changed
    return changes


def _error_line(output: str) -> str:
    """The last line of a traceback's exception in ``output``, else its last line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith(RESULT_PREFIX)]
    exc = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*")
    found = [ln for ln in lines if exc.match(ln)]
    return (found or lines or ["(no output)"])[-1]


def run_example(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float, log_path: Path
) -> dict[str, Any]:
    """Run ``cmd`` in its own process group and ``cwd``; rc, whole-process wall, the
    launcher's RESULT_JSON (if printed) and the error line of a failed run. Unlike
    :func:`common.run_json`, a failure is a result here, not an exception."""
    cwd.mkdir(parents=True, exist_ok=True)
    load_before = loadavg()
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=str(cwd),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # Ray's daemons and Dask's workers: one group, ended below
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    wall = time.perf_counter() - start
    with contextlib.suppress(ProcessLookupError):  # anything of this run left behind
        os.killpg(proc.pid, signal.SIGKILL)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(output)
    found = [ln for ln in output.splitlines() if ln.startswith(RESULT_PREFIX)]
    result = json.loads(found[-1][len(RESULT_PREFIX) :]) if found else None
    out: dict[str, Any] = {
        "rc": "timeout" if timed_out else proc.returncode,
        "process_wall_s": wall,
        "load_before": load_before,
        "load_after": loadavg(),
        "launcher": result,
        "log": str(log_path),
    }
    fits = (result or {}).get("fits") or []
    last = fits[-1] if fits else {}
    out.update(
        metric=last.get("metric"),
        mode=last.get("mode"),
        best=last.get("best"),
        trials=last.get("trials"),
        errors=last.get("errors"),
        fit_wall_s=last.get("fit_wall_s"),
        trial_error=last.get("trial_error"),
    )
    if timed_out:
        out["error"] = f"timed out after {timeout:.0f} s"
    elif proc.returncode != 0:
        out["error"] = (result or {}).get("error") or _error_line(output)
    return out


def _child_env(home: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def warm_prefect(prefect_home: Path, root: Path, timeout: float) -> dict[str, Any]:
    """One tiny popflow run on the embedded default: creates the database the popflow runs
    share and starts popflow's local Prefect server, which the runs after it reuse (a
    user's very first run; stopped by :func:`stop_prefect` at the end)."""
    code = (
        "from popflow import report, run\n"
        "def train(config):\n    report({'score': 1})\n"
        "run(train, {}, storage='results', name='warm_up', verbose=0)\n"
        "print('RESULT_JSON {}')\n"
    )
    env = _child_env(root / "warmup", {"PREFECT_HOME": str(prefect_home)})
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    return run_example(
        [python(), "-c", code], env, root / "warmup", timeout, _log("prefect_warmup")
    )


def stop_prefect(prefect_home: Path) -> None:
    """Stop the local Prefect server the popflow runs used, by its PID."""
    subprocess.run(
        [python(), "-m", "popflow.flows.api.cli", "server", "stop"],
        env={**os.environ, "PREFECT_HOME": str(prefect_home)},
        check=False,
        timeout=120,
    )


def _log(name: str) -> Path:
    return RESULTS_DIR / "logs" / f"ray_examples_{name}.log"


def _fmt(x: Any) -> Any:
    if x is None:
        return "-"
    if isinstance(x, float):
        return float(f"{x:.4g}")
    return x


def _best_cell(run: dict[str, Any]) -> str:
    if run.get("best") is None:
        return "-"
    return f"{run['best']:.4g}" if isinstance(run["best"], float) else str(run["best"])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="full settings, popflow and Ray")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="--smoke-test on popflow and on Ray, alternately",
    )
    parser.add_argument("--only", help="comma-separated example names (default: all)")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument(
        "--ray-python", default=python(), help="interpreter with ray[tune] (default: this one)"
    )
    parser.add_argument(
        "--ray-version",
        help=f"take the examples from this Ray release's wheel (pip download; CI: {RAY_VERSION}) "
        "instead of the one --ray-python has installed",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs per side, alternately (median wall shown)"
    )
    args = parser.parse_args()

    names = args.only.split(",") if args.only else QUICK if args.quick else EXAMPLES
    if args.ray_version:
        wheel_dir = Path(tempfile.mkdtemp(prefix="popflow-ray-wheel-"))
        source_dir = examples_from_wheel(args.ray_version, wheel_dir)
    else:
        source_dir = examples_dir(args.ray_python)
    mode = "full" if args.full else "smoke"
    print(f"Ray's examples from {source_dir}; {mode} mode; popflow: {python()}", flush=True)
    if args.full or args.side_by_side:
        print(f"Ray: {args.ray_python}", flush=True)

    figures: dict[str, Any] = {
        "mode": mode,
        "examples_dir": str(source_dir),
        "popflow_python": python(),
        "ray_python": args.ray_python,
        "timeout_s": args.timeout,
        "runs": [],
    }
    with contextlib.ExitStack() as stack:
        if args.keep:
            root = Path(tempfile.mkdtemp(prefix="popflow-ray-examples-"))
        else:
            root = Path(stack.enter_context(scratch_dir("popflow-ray-examples-")))
        scripts = root / "scripts"
        changes = write_rewritten(source_dir, scripts)
        prefect_home = root / "prefect-home"
        warm = warm_prefect(prefect_home, root, args.timeout)
        stack.callback(stop_prefect, prefect_home)
        figures["prefect_warmup"] = warm
        print(
            f"rewritten copies in {scripts}; Prefect database and popflow's local Prefect "
            f"server started by a warm-up run in {warm['process_wall_s']:.1f} s (rc "
            f"{warm['rc']}, not counted)",
            flush=True,
        )
        popflow_env = {"PREFECT_HOME": str(prefect_home)}
        ray_env = {"RAY_USAGE_STATS_ENABLED": "0"}
        script_args = [] if args.full else ["--smoke-test"]
        for name in names:
            entry: dict[str, Any] = {"example": name}
            figures["runs"].append(entry)
            if not (source_dir / f"{name}.py").exists():
                entry["missing"] = True
                print(f"{name}: not in the ray wheel", flush=True)
                continue
            entry["rewritten_lines"] = changes[name]
            sides = [("popflow", python(), scripts / f"{name}.py", popflow_env)]
            if args.full or args.side_by_side:
                sides.append(("ray", args.ray_python, source_dir / f"{name}.py", ray_env))
            for repeat in range(args.repeats):
                for side, interpreter, script, extra in sides:
                    cwd = root / "runs" / f"{name}_{side}_{repeat}"
                    cmd = [interpreter, "-c", f"PREFIX = {RESULT_PREFIX!r}\n" + LAUNCHER]
                    cmd += [side, str(script), *script_args]
                    run = run_example(
                        cmd,
                        _child_env(cwd, {**extra, **side_env(name, side, cwd)}),
                        cwd,
                        args.timeout,
                        _log(f"{mode}_{name}_{side}_{repeat}"),
                    )
                    entry.setdefault(f"{side}_runs", []).append(run)
                    note = f", {run['error']}" if run.get("error") else ""
                    print(
                        f"{name} on {side}: rc {run['rc']}, {run['process_wall_s']:.1f} s, "
                        f"best {run['metric']} {_best_cell(run)}{note}",
                        flush=True,
                    )
            for side, *_ in sides:  # the run of median wall stands for the side
                runs = sorted(entry[f"{side}_runs"], key=lambda r: r["process_wall_s"])
                entry[side] = runs[(len(runs) - 1) // 2]
        if args.keep:
            print(f"kept {root}")

    print()
    if args.full or args.side_by_side:
        print(full_table(figures["runs"]))
    else:
        print(smoke_table(figures["runs"]))
    path = write_json("ray_examples", figures)
    print(f"\nfigures written to {path}; logs in {RESULTS_DIR / 'logs'}")


def smoke_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    for entry in runs:
        if entry.get("missing"):
            rows.append(
                [entry["example"], "missing", "-", "-", "-", "-", "-", "not in the ray wheel"]
            )
            continue
        run = entry["popflow"]
        metric = f"{run['metric']} ({run['mode']})" if run.get("metric") else "-"
        rows.append(
            [entry["example"], run["rc"], run["process_wall_s"], metric, _best_cell(run),
             _fmt(run.get("trials")), _fmt(run.get("errors")),
             run.get("error") or run.get("trial_error") or ""]
        )  # fmt: skip
    headers = ["example", "rc", "wall s", "metric", "best", "trials", "errors",
               "last error line (run, else first errored trial)"]  # fmt: skip
    return table(headers, rows)


def full_table(runs: list[dict[str, Any]]) -> str:
    rows = []
    notes = []
    for entry in runs:
        name = entry["example"]
        if entry.get("missing"):
            rows.append([name, "missing", "missing", "-", "-", "-", "-", "-"])
            continue
        pop, ray = entry["popflow"], entry["ray"]

        def wall(run: dict[str, Any], side: str, entry: dict[str, Any] = entry) -> str:
            s = f"{run['process_wall_s']:.1f}"
            others = [r["process_wall_s"] for r in entry.get(f"{side}_runs", [])]
            if len(others) > 1:
                s += f" ({', '.join(f'{w:.1f}' for w in others)})"
            return s if run["rc"] == 0 else f"{s} (rc {run['rc']})"

        ok = pop["rc"] == 0 and ray["rc"] == 0
        ratio = pop["process_wall_s"] / ray["process_wall_s"] if ok else "-"
        metric = pop.get("metric") or ray.get("metric")
        rows.append(
            [name, wall(pop, "popflow"), wall(ray, "ray"), ratio, f"{metric} ({pop.get('mode') or ray.get('mode')})"
             if metric else "-", _best_cell(pop), _best_cell(ray),
             f"{_fmt(pop.get('errors'))} / {_fmt(ray.get('errors'))}"]
        )  # fmt: skip
        for side, run in (("popflow", pop), ("Ray", ray)):
            if run.get("error"):
                notes.append(f"{name} on {side}: {run['error']}")
            if run.get("errors"):
                trial = f": {run['trial_error']}" if run.get("trial_error") else ""
                notes.append(f"{name} on {side}: {run['errors']} errored trial(s){trial}")
    headers = ["example", "popflow wall s (median; each run)", "Ray wall s", "ratio", "metric",
               "popflow best", "Ray best", "errored trials (popflow / Ray)"]  # fmt: skip
    out = table(headers, rows)
    return out + ("\n\n" + "\n".join(notes) if notes else "")


if __name__ == "__main__":
    sys.exit(main())

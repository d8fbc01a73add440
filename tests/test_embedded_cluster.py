"""The embedded cluster: a script needs no ``if __name__ == "__main__":`` guard, as with Ray
(its workers never run the user's main script), and its workers are sized so that a trial
that fits the machine fits one of them."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from multiprocessing import spawn
from pathlib import Path

import pytest
from support.scripts import embedded_env

import popflow
from popflow import run, tune
from popflow.infra.cluster.dask_cluster import (
    ClusterStart,
    EmbeddedSize,
    default_workers,
    embedded_size,
)
from popflow.infra.cluster.worker_main import (
    WORKER_PROCESS_NAME,
    main_is_guarded,
    worker_preparation_data,
)

#: Ray Tune's smallest script, with no main guard.
GUARDLESS = """
from popflow import tune
def train(config):
    for i in range(3):
        tune.report({"score": i * config["x"]})
tuner = tune.Tuner(train, param_space={"x": tune.uniform(0, 1)}, tune_config=tune.TuneConfig(num_samples=2, metric="score", mode="max"))
print(tuner.fit().get_best_result().config)
"""

#: A guard-less script whose top level leaves a mark; its only trial hangs on its first
#: attempt, so its segment times out, the worker's process is ended and its nanny starts
#: it again, and the retry runs on the restarted worker (there is one worker).
MARKS_ONCE = """
import os
import threading

from popflow import report, run

with open("imported.txt", "a") as f:  # each process that runs this script adds a line
    f.write(f"{os.getpid()}\\n")


def train(config):
    with open(config["ran"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    if not os.path.exists(config["hung"]):
        open(config["hung"], "w").close()
        threading.Event().wait()
    report({"score": 1})


results = run(
    train,
    {"ran": os.path.abspath("ran.txt"), "hung": os.path.abspath("hung")},
    n_workers=1,
    max_failures=1,
    segment_timeout_s=2,
    storage="results",
    name="restart",
)
print("statuses", [r.status for r in results])
print("driver", os.getpid())
"""

#: The user's own module next to the script, and a script whose trainable uses it.
HELPERS = """
def double(x):
    return 2 * x
"""
USES_HELPERS = """
import os

import helpers
from popflow import grid_search, report, run


def train(config):
    report({"score": helpers.double(config["x"]), "pid": os.getpid()})


results = run(train, {"x": grid_search([1, 2])}, storage="results", name="local_module")
print("scores", sorted(r.metrics["score"] for r in results))
print("pids", sorted({r.metrics["pid"] for r in results}))
print("driver", os.getpid())
"""


def run_script(tmp_path: Path, source: str, embedded_prefect: bool) -> subprocess.CompletedProcess:
    """``python script.py`` in ``tmp_path``, on the embedded Prefect server unless the
    session's (``PREFECT_API_URL``, set by the ``prefect_server`` fixture) is wanted."""
    (tmp_path / "script.py").write_text(textwrap.dedent(source))
    env = dict(os.environ)
    if embedded_prefect:
        env = embedded_env(str(tmp_path / "prefect-home"), env)  # the user's own, fresh
    return subprocess.run(
        [sys.executable, "script.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def printed(proc: subprocess.CompletedProcess, label: str) -> str:
    """What the script printed after ``label``."""
    return proc.stdout.split(f"{label} ", 1)[1].splitlines()[0]


@pytest.mark.system
def test_a_script_without_main_guard_runs_as_with_ray(tmp_path):
    proc = run_script(tmp_path, GUARDLESS, embedded_prefect=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    best = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert set(best) == {"x"} and 0 <= best["x"] <= 1
    assert "Nanny failed" not in out and "Traceback" not in out, out[-3000:]


@pytest.mark.system
def test_workers_never_run_the_scripts_top_level_even_when_restarted(prefect_server, tmp_path):
    proc = run_script(tmp_path, MARKS_ONCE, embedded_prefect=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert printed(proc, "statuses") == "['TERMINATED']"
    driver = printed(proc, "driver")
    ran = (tmp_path / "ran.txt").read_text().split()
    # the hung attempt and the retry, on the worker before and after its restart
    assert len(ran) == 2 and len(set(ran)) == 2 and driver not in ran
    assert (tmp_path / "imported.txt").read_text().split() == [driver]
    assert "Nanny failed" not in out


@pytest.mark.system
def test_the_users_module_next_to_the_script_imports_on_workers(prefect_server, tmp_path):
    (tmp_path / "helpers.py").write_text(textwrap.dedent(HELPERS))
    proc = run_script(tmp_path, USES_HELPERS, embedded_prefect=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert printed(proc, "scores") == "[2, 4]"
    # it ran on the workers, not the driver
    assert int(printed(proc, "driver")) not in ast.literal_eval(printed(proc, "pids"))


@pytest.mark.unit
def test_only_dask_worker_processes_lose_a_guardless_main(tmp_path):
    guardless, guarded = tmp_path / "guardless.py", tmp_path / "guarded.py"
    guardless.write_text(GUARDLESS)
    guarded.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv)\n")

    def preparation_data(script):
        def get(name):
            data = spawn.get_preparation_data(name)
            data.pop("init_main_from_name", None)
            return {**data, "init_main_from_path": str(script)}

        return get

    other = worker_preparation_data(preparation_data(guardless), "SomeProcess-1")
    worker = worker_preparation_data(preparation_data(guardless), WORKER_PROCESS_NAME)
    kept = worker_preparation_data(preparation_data(guarded), WORKER_PROCESS_NAME)
    assert other["init_main_from_path"] == str(guardless)  # not a Dask worker: untouched
    assert "init_main_from_path" not in worker
    assert kept["init_main_from_path"] == str(guarded)  # Dask's usual way: safe to import
    assert worker["sys_path"] == other["sys_path"] and worker["dir"] == os.getcwd()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("source", "guarded"),
    [
        ("if __name__ == '__main__':\n    pass\n", True),
        ("if '__main__' == __name__:\n    pass\n", True),
        ("def f():\n    if __name__ == '__main__':\n        pass\n", False),
        ("if __name__ != '__main__':\n    pass\n", False),
        ("print(1)\n", False),
        ("def broken(:\n", False),
    ],
)
def test_a_main_guard_is_recognised(tmp_path, source, guarded):
    script = tmp_path / f"s{abs(hash(source))}.py"
    script.write_text(source)
    assert main_is_guarded(str(script)) is guarded


@pytest.mark.system
def test_a_guardless_scripts_cached_function_fails_with_what_to_do(prefect_server, tmp_path):
    """What a worker cannot find by name in a guardless script's __main__ (a
    ``functools.cache``'d function) errors the trial with the way out."""
    source = """
        import functools
        from popflow import run, tune

        @functools.cache
        def data():
            return 3

        def train(config):
            tune.report({"score": data()})

        try:
            run(train, storage="results", name="cached")
        except Exception as e:
            print("error", type(e).__name__, str(e).splitlines()[0])
    """
    proc = run_script(tmp_path, source, embedded_prefect=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    error = printed(proc, "error")
    assert error.startswith("CodeUnavailable") and "Can't get attribute 'data'" in error
    assert "is not run on the workers: move what its trainable refers to by name" in error


@pytest.mark.integration
def test_the_patch_lasts_while_any_embedded_cluster_is_open_and_is_then_restored():
    original = spawn.get_preparation_data
    # one after the other: two LocalClusters starting at once in one process race in
    # distributed's own lazy dashboard import ("has no attribute 'scheduler'")
    first = ClusterStart(1)
    first.cluster()
    second = ClusterStart(1)
    try:
        second.cluster()
        first.close()
        assert spawn.get_preparation_data is not original  # the second is still open
    finally:
        first.close()
        second.close()
    assert spawn.get_preparation_data is original


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cores", "trial_cpu", "n_workers", "gpus", "expected"),
    [
        (2, None, None, 0, EmbeddedSize(2, {"CPU": 1.0})),  # one worker per core
        (2, 1.0, None, 0, EmbeddedSize(2, {"CPU": 1.0})),
        (2, 0.5, None, 0, EmbeddedSize(2, {"CPU": 1.0})),  # as before: cpu <= 1
        (2, 2.0, None, 0, EmbeddedSize(1, {"CPU": 2.0})),
        (2, 3.0, None, 0, EmbeddedSize(1, {"CPU": 2.0})),  # too big: slots_per_worker says so
        (16, 1.5, None, 2, EmbeddedSize(10, {"CPU": 1.6, "GPU": 0.2})),
        (8, 4.0, None, 0, EmbeddedSize(2, {"CPU": 4.0})),
        (2, 2.0, 2, 0, EmbeddedSize(2, {"CPU": 1.0})),  # the user's n_workers is kept
        (2, None, 4, 0, EmbeddedSize(4, {"CPU": 1.0})),  # never under 1 CPU a worker
    ],
)
def test_embedded_workers_are_sized_for_the_trial(cores, trial_cpu, n_workers, gpus, expected):
    assert embedded_size(cores, trial_cpu, n_workers, gpus) == expected


@pytest.mark.integration
def test_embedded_workers_start_with_popflow_loaded_and_dasks_sampling_slowed():
    """The worker side is imported as each worker starts (not by the first runner made on
    it), and Dask's profiler and monitors sample less often than its defaults, which took
    a tenth of a core per worker on a small machine; a Dask cluster of one's own is left as
    it is."""
    from popflow.infra.cluster.dask_cluster import (
        EMBEDDED_WORKER_CONFIG,
        RUNNER_MODULE,
        dask_client,
    )

    def look() -> tuple[bool, dict[str, str]]:
        import dask

        return RUNNER_MODULE in sys.modules, {k: dask.config.get(k) for k in EMBEDDED_WORKER_CONFIG}

    with dask_client(None, 1) as client:
        (seen,) = client.run(look).values()
    assert seen == (True, EMBEDDED_WORKER_CONFIG)
    assert EMBEDDED_WORKER_CONFIG["distributed.worker.profile.interval"] == "100ms"


@pytest.mark.unit
def test_embedded_size_rejects_no_workers():
    with pytest.raises(ValueError, match=r"`n_workers` is 0, but must be >= 1"):
        embedded_size(2, None, 0)


def two_reports(config):
    for i in range(2):
        tune.report({"score": i})


def two_reports_too(config):  # tune.with_resources marks the function itself: not two_reports
    two_reports(config)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["resources_per_trial", "with_resources"])
def test_a_trial_needing_every_core_runs_on_the_embedded_cluster(prefect_server, tmp_path, how):
    cores = default_workers()
    if how == "with_resources":
        args = {"trainable": tune.with_resources(two_reports_too, {"cpu": cores})}
    else:
        args = {"trainable": two_reports, "resources_per_trial": {"cpu": cores}}
    results = run(**args, num_samples=2, storage=str(tmp_path), name=how)
    assert [r.status for r in results] == ["TERMINATED"] * 2
    assert [r.metrics["training_iteration"] for r in results] == [2, 2]


@pytest.mark.integration
def test_a_trial_bigger_than_the_machine_fails_fast(prefect_server, tmp_path):
    cores = default_workers()
    with pytest.raises(
        ValueError,
        match=rf"`resources_per_trial\['cpu'\]` is {cores + 1}, but the embedded cluster's .*"
        rf"workers offer \{{'CPU': {cores}.0\}}",
    ):
        run(two_reports, resources_per_trial={"cpu": cores + 1}, storage=str(tmp_path), name="big")


def pid_reports(config):
    tune.report({"pid": os.getpid()})


@pytest.mark.integration
def test_init_num_cpus_sizes_the_embedded_cluster(prefect_server, tmp_path):
    """Ray's ``ray.init(num_cpus=1)``: one CPU, so one worker runs every trial; and a
    trial needing 2 CPUs fits once ``num_cpus=2``, whatever the machine."""
    try:
        popflow.init(num_cpus=1)
        one = run(pid_reports, num_samples=3, storage=str(tmp_path), name="one-cpu")
        assert len({r.metrics["pid"] for r in one}) == 1
        with pytest.raises(ValueError, match=r"is 2, but .*workers offer \{'CPU': 1.0\}"):
            run(pid_reports, resources_per_trial={"cpu": 2}, storage=str(tmp_path), name="x")
        popflow.init(num_cpus=2)
        two = run(
            pid_reports, resources_per_trial={"cpu": 2}, storage=str(tmp_path), name="two-cpu"
        )
        assert two[0].status == "TERMINATED"
    finally:
        popflow.init()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("gpus", "trial_gpu", "expected_workers", "gpu_each", "devices"),
    [
        (1, 1.0, 1, 1.0, (("0",),)),
        (1, 0.5, 2, 0.5, (("0",), ("0",))),  # two workers share the device
        (4, 1.0, 2, 2.0, (("0", "1"), ("2", "3"))),
        (2, 2.0, 1, 2.0, (("0", "1"),)),
    ],
)
def test_gpu_trials_get_workers_they_fit(gpus, trial_gpu, expected_workers, gpu_each, devices):
    size = embedded_size(2, None, None, gpus, trial_gpu)
    assert (size.n_workers, size.resources["GPU"], size.devices) == (
        expected_workers,
        gpu_each,
        devices,
    )


@pytest.mark.unit
def test_gpu_workers_are_pinned_to_the_visible_devices(monkeypatch):
    """A user's own ``CUDA_VISIBLE_DEVICES`` restricts the devices the workers get."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert embedded_size(4, None, None, 2, 1.0).devices == (("2",), ("5",))


def device_reports(config):
    for _ in range(2):
        tune.report({"pid": os.getpid(), "devices": os.environ.get("CUDA_VISIBLE_DEVICES")})


@pytest.mark.integration
def test_each_gpu_trial_sees_only_its_device(prefect_server, tmp_path):
    """Two GPUs (``popflow.init(num_gpus=2)``; no GPU is needed to check the pinning): one
    worker process per device, and a ``gpu: 1`` trial runs with CUDA_VISIBLE_DEVICES set to
    its worker's device; a CPU trial's workers are not pinned."""
    try:
        popflow.init(num_gpus=2)
        grid = run(
            device_reports,
            resources_per_trial={"gpu": 1},
            num_samples=4,
            storage=str(tmp_path),
            name="two-gpus",
        )
        seen = {(r.metrics["pid"], r.metrics["devices"]) for r in grid}
        assert {d for _, d in seen} == {"0", "1"}
        assert len({p for p, _ in seen}) == 2  # one process per device, each keeps its own
        cpu = run(device_reports, num_samples=2, storage=str(tmp_path), name="cpu")
        assert {r.metrics["devices"] for r in cpu} == {os.environ.get("CUDA_VISIBLE_DEVICES")}
    finally:
        popflow.init()


@pytest.mark.integration
def test_init_num_gpus_lets_a_one_gpu_trial_run(prefect_server, tmp_path):
    """Ray's ``ray.init(num_gpus=1)``: a ``gpu: 1`` trial fits the embedded cluster (which
    used to cut one GPU into 0.5 per worker and refuse it); trials share the one GPU
    worker one at a time."""
    try:
        popflow.init(num_gpus=1)
        grid = run(
            pid_reports,
            resources_per_trial={"gpu": 1},
            num_samples=2,
            storage=str(tmp_path),
            name="one-gpu",
        )
        assert [r.status for r in grid] == ["TERMINATED"] * 2
        assert len({r.metrics["pid"] for r in grid}) == 1
        with pytest.raises(ValueError, match="`num_gpus` is -1"):
            popflow.init(num_gpus=-1)
    finally:
        popflow.init()


@pytest.mark.unit
def test_whether_main_is_guarded_never_depends_on_pythons_ast(tmp_path, monkeypatch):
    """CPython 3.11's AST conversion is not thread-safe: an ``ast.parse`` here while
    another thread parsed (a 3.11 traceback does) failed a deployed run's first attempt
    with ``SystemError: AST constructor recursion depth mismatch`` and ``Nanny failed
    to start``; a lock around popflow's own parse could not stop the others. Before:
    the SystemError below reached the worker's start."""
    import ast
    import threading

    from popflow.infra.cluster import worker_main as cluster

    def broken(*args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch (before=54, after=95)")

    monkeypatch.setattr(ast, "parse", broken)
    sources = {
        "guarded": (
            '# coding: utf-8\nimport x\n\nif (__name__ == "__main__"):  # run\n    x.go()\n',
            True,
        ),
        "one_line": ("if __name__ == '__main__': main()\n", True),
        "nested": ("class A:\n    if __name__ == '__main__':\n        pass\nx = 1\n", False),
        "after_dedent": ("def f():\n    pass\nif '__main__' == __name__:\n    f()\n", True),
        "elif": ("if a:\n    pass\nelif __name__ == '__main__':\n    pass\n", False),
        "and": ("if __name__ == '__main__' and x:\n    pass\n", False),
        "unterminated": ("x = (\n", False),
    }
    answers: dict[str, bool] = {}

    def ask(name: str, source: str) -> None:
        script = tmp_path / f"{name}.py"
        script.write_text(source)
        answers[name] = cluster.main_is_guarded(str(script))

    threads = [threading.Thread(target=ask, args=(n, s)) for n, (s, _) in sources.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == {name: guarded for name, (_, guarded) in sources.items()}

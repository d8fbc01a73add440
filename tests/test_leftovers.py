"""A run of the suite leaves nothing behind (issue 48): a script never falls back to the
user's ``~/.prefect``, and a run that leaves a process running or changes the user's
Prefect home fails, naming the test, with the process stopped by its PID
(tests/support/leftovers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support import leftovers
from support.inner_pytest import TESTS, run_pytest, write_tests
from support.polling import wait_for
from support.prefect_homes import changes, settings_files, snapshot
from support.scripts import embedded_env


@pytest.mark.unit
@pytest.mark.parametrize("home", [None, ""])
def test_a_script_without_a_prefect_home_is_refused(home):
    with pytest.raises(ValueError, match="needs a Prefect home"):
        embedded_env(home)


@pytest.mark.unit
def test_a_script_in_the_users_own_prefect_home_is_refused():
    with pytest.raises(ValueError, match="the user's own Prefect home"):
        embedded_env(Path.home() / ".prefect")
    with pytest.raises(ValueError, match="the user's own Prefect home"):
        embedded_env("~/.prefect")


@pytest.mark.unit
def test_a_scripts_environment_has_its_home_and_the_runs_mark_and_no_other_prefect_setting(
    tmp_path,
):
    bare = {"PATH": "/bin", "PREFECT_API_URL": "http://127.0.0.1:4200/api", "PREFECT_HOME": "x"}
    env = embedded_env(tmp_path, bare)
    assert env == {
        "PATH": "/bin",
        "PREFECT_HOME": str(tmp_path),
        leftovers.SESSION_VARIABLE: os.environ[leftovers.SESSION_VARIABLE],
    }


@pytest.mark.unit
def test_the_suite_runs_in_a_prefect_home_of_its_own(prefect_home):
    assert os.environ["PREFECT_HOME"] == prefect_home
    assert not leftovers.is_users_prefect_home(Path(prefect_home))


@pytest.mark.unit
def test_a_file_written_added_or_removed_in_a_prefect_home_is_a_change(tmp_path):
    home = tmp_path / ".prefect"
    assert changes(None, snapshot(home)) == []
    home.mkdir()
    (home / "prefect.db").write_text("runs")
    (home / "profiles.toml").write_text("")
    before = snapshot(home)
    assert changes(before, snapshot(home)) == []
    (home / "prefect.db").write_text("runs and the suite's")
    (home / "profiles.toml").unlink()
    (home / "storage").mkdir()
    assert changes(before, snapshot(home)) == [
        "added storage",
        "removed profiles.toml",
        "changed prefect.db",
    ]
    assert changes(None, before) == [
        "created (it did not exist)",
        "added prefect.db",
        "added profiles.toml",
    ]


@pytest.mark.unit
def test_writing_through_a_link_in_a_prefect_home_is_a_change(tmp_path):
    """A user's home may link its database elsewhere: what is written there is seen."""
    home, elsewhere = tmp_path / ".prefect", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    (elsewhere / "prefect.db").write_text("runs")
    (home / "prefect.db").symlink_to(elsewhere / "prefect.db")
    (home / "storage").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(home)
    (elsewhere / "prefect.db").write_text("runs and the suite's")
    assert changes(before, snapshot(home)) == ["changed prefect.db", "changed storage/prefect.db"]
    (home / "loop").symlink_to(home, target_is_directory=True)  # a link back up ends
    assert changes(before, snapshot(home))[0] == "added loop"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        (".env", "OTHER=1\nPREFECT_API_URL=http://127.0.0.1:4200/api\n", ".env (PREFECT_API_URL)"),
        (".env", "export PREFECT_HOME=/x\n", ".env (PREFECT_HOME)"),
        (".env", "export\tPREFECT_API_URL=http://h/api\n", ".env (PREFECT_API_URL)"),
        (".env", "'PREFECT_API_URL'=http://h/api\n", ".env (PREFECT_API_URL)"),
        (".env", "prefect_api_url = http://h/api\n", ".env (prefect_api_url)"),
        ("prefect.toml", '[api]\nurl = "http://127.0.0.1:4200/api"\n', "prefect.toml"),
        ("pyproject.toml", '[tool.prefect]\nhome = "/x"\n', "pyproject.toml ([tool.prefect])"),
    ],
)
def test_prefects_settings_files_in_a_folder_are_found(tmp_path, name, text, said):
    (tmp_path / name).write_text(text)
    assert settings_files(tmp_path) == [str(tmp_path / said)]


@pytest.mark.unit
def test_files_without_prefect_settings_are_not(tmp_path):
    (tmp_path / ".env").write_text("AWS_PROFILE=x\n# PREFECT_API_URL=commented\n")
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert settings_files(tmp_path) == []


# The plugin at work: each test below runs a pytest of its own with it, as a user whose home
# is under the test's tmp_path (no ``PREFECT_`` settings of theirs unless the test gives
# some), outside this run (no SESSION_VARIABLE: a pytest inside the run leaves the sweep to
# the outer one).

SLEEPER = "[sys.executable, '-c', 'import time; time.sleep(600)']"


def as_user(home: Path, **settings: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != leftovers.SESSION_VARIABLE and not k.startswith("PREFECT_")
    }
    return {**env, "HOME": str(home), **settings}


def inner_run(tmp_path: Path, source: str, **settings: str) -> tuple[pytest.RunResult, Path]:
    """``source`` as a test file run by a pytest of its own with the leftovers plugin; the
    result, and the folder it ran in (where its tests write what they started)."""
    folder, home = tmp_path / "run", tmp_path / "user"
    folder.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    write_tests(folder, test_inner=source)
    return run_pytest(folder, "-p", "support.leftovers", env=as_user(home, **settings)), folder


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def running_with(marker: str) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read() and alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def assert_left(result: pytest.RunResult, folder: Path, during: str) -> None:
    """The inner run failed naming the process its test wrote to ``left.pid``, started
    ``during`` that test, and stopped it."""
    pid = int((folder / "left.pid").read_text())
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(
        ["*the suite left * process(es) running*", f"*pid {pid}, started during {during},*"]
    )
    assert not alive(pid), f"{pid} still runs"


#: What the old ``embedded_env()`` did: a script with no ``PREFECT_`` settings (no
#: ``PREFECT_HOME``) starts popflow's local server in ``~/.prefect`` and leaves it.
LEAKING = """
    import os, subprocess, sys

    def test_a_script_on_the_users_home():
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        code = "from popflow.infra import local_server; print(local_server.local_server().pid)"
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout
        with open("left.pid", "w") as f:
            f.write(out.split()[-1])
    """


@pytest.mark.system
def test_a_run_that_leaves_a_server_in_the_users_home_fails_naming_the_test_and_stops_it(
    tmp_path,
):
    # a process of the user's own (not below the run) that the sweep must leave alone
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={k: v for k, v in os.environ.items() if k != leftovers.SESSION_VARIABLE},
    )
    try:
        result, folder = inner_run(tmp_path, LEAKING)
        assert_left(result, folder, "test_inner.py::test_a_script_on_the_users_home (call)")
        home = tmp_path / "user" / ".prefect"
        result.stdout.fnmatch_lines(
            [
                f"*a Prefect server, pid *PREFECT_HOME={home} (the user's own)*",
                f"*the suite changed the user's Prefect home {home}*",
                "*created (it did not exist)*",
            ]
        )
        assert alive(bystander.pid), "the sweep stopped a process the run did not start"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.integration
def test_a_run_that_stops_what_it_starts_passes(tmp_path):
    """A process started and stopped, and multiprocessing's helpers (a Dask cluster starts
    them), which live as long as pytest does: nothing is reported."""
    home = tmp_path / "user" / ".prefect"
    home.mkdir(parents=True)
    (home / "prefect.db").write_text("the user's runs")
    result, _ = inner_run(
        tmp_path,
        f"""
        import multiprocessing, subprocess, sys

        def test_a_process_started_and_stopped():
            proc = subprocess.Popen({SLEEPER})
            proc.kill()
            proc.wait()

        def test_a_lock_shared_with_spawned_processes():
            global LOCK
            LOCK = multiprocessing.get_context("spawn").Lock()

        def test_a_forkserver():
            ctx = multiprocessing.get_context("forkserver")
            p = ctx.Process(target=print)
            p.start()
            p.join()
        """,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "what the suite left behind" not in result.stdout.str()
    assert (home / "prefect.db").read_text() == "the user's runs"


@pytest.mark.integration
def test_a_process_started_with_an_environment_of_its_own_is_found(tmp_path):
    result, folder = inner_run(
        tmp_path,
        f"""
        import subprocess, sys

        def test_leaves_one():
            proc = subprocess.Popen({SLEEPER}, env={{}}, start_new_session=True)
            open("left.pid", "w").write(str(proc.pid))
        """,
    )
    assert_left(result, folder, "test_inner.py::test_leaves_one (call)")


@pytest.mark.integration
def test_a_process_a_long_lived_helper_starts_is_the_test_that_asked_for_it(tmp_path):
    """A helper started in the first test (a session's Dask worker, a forkserver) starts a
    process during the second: the second test is named, not the first."""
    spawner = (
        "import subprocess, sys\\n"
        "for line in sys.stdin:\\n"
        f"    p = subprocess.Popen({SLEEPER}, start_new_session=True)\\n"
        "    print(p.pid, flush=True)\\n"
    )
    result, folder = inner_run(
        tmp_path,
        f"""
        import subprocess, sys, pytest

        @pytest.fixture(scope="session")
        def helper():
            proc = subprocess.Popen([sys.executable, "-c", "{spawner}"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            yield proc
            proc.stdin.close()
            proc.wait()

        def test_first(helper):
            pass

        def test_second(helper):
            helper.stdin.write("go\\n")
            helper.stdin.flush()
            open("left.pid", "w").write(helper.stdout.readline().strip())
        """,
    )
    assert_left(result, folder, "test_inner.py::test_second (call)")


#: The inner run's conftest for a reader who may not read the environment of the processes
#: it finds: as a user who is not root sees another user's process or an undumpable one.
#: (Made so, not for real: root here read a process of another user's environment even
#: without CAP_SYS_PTRACE.)
ENVIRONMENT_HIDDEN = """
from support import processes

processes.environment = lambda pid: None
"""


@pytest.mark.integration
def test_a_process_whose_environment_cannot_be_read_is_found(tmp_path):
    folder, home = tmp_path / "run", tmp_path / "user"
    folder.mkdir()
    home.mkdir()
    write_tests(
        folder,
        conftest=ENVIRONMENT_HIDDEN,
        test_inner=f"""
        import subprocess, sys

        def test_leaves_one():
            proc = subprocess.Popen({SLEEPER})
            open("left.pid", "w").write(str(proc.pid))
        """,
    )
    result = run_pytest(folder, "-p", "support.leftovers", env=as_user(home))
    assert_left(result, folder, "test_inner.py::test_leaves_one (call)")
    result.stdout.fnmatch_lines(["*PREFECT_HOME=unknown (its environment cannot be read)*"])


#: A test a nested pytest runs: it starts a process and waits (to be killed).
NESTED = f"""
import subprocess, sys, time

def test_starts_one():
    proc = subprocess.Popen({SLEEPER}, start_new_session=True)
    open("nested.pid", "w").write(str(proc.pid))
    time.sleep(600)
"""


@pytest.mark.integration
def test_a_pytest_run_inside_the_run_leaves_its_sweep_to_the_outer_one(tmp_path):
    """A pytest in the same process (``pytest.main``) did clear the run's mark for the
    tests after it; a pytest subprocess killed mid-run did leave its children."""
    result, folder = inner_run(
        tmp_path,
        f"""
        import os, subprocess, sys, time, pytest

        NESTED = {NESTED!r}

        def test_a_pytest_in_this_process(tmp_path):
            (tmp_path / "test_n.py").write_text("def test_ok():\\n    pass\\n")
            assert pytest.main([str(tmp_path), "-q", "-p", "support.leftovers",
                                "-p", "no:cacheprovider"]) == 0

        def test_a_pytest_subprocess_killed(tmp_path):
            (tmp_path / "test_n.py").write_text(NESTED)
            nested = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p",
                                       "support.leftovers", "-p", "no:cacheprovider",
                                       str(tmp_path)], cwd=tmp_path)
            pid_file = tmp_path / "nested.pid"
            deadline = time.monotonic() + 60
            while not (pid_file.exists() and pid_file.read_text()):
                assert time.monotonic() < deadline and nested.poll() is None
                time.sleep(0.05)
            nested.kill()
            nested.wait()
            open("left.pid", "w").write(pid_file.read_text())
        """,
    )
    assert_left(result, folder, "test_inner.py::test_a_pytest_subprocess_killed (call)")
    result.stdout.fnmatch_lines(["*the suite left 1 process(es) running*"])


@pytest.mark.integration
def test_a_process_that_forks_again_and_again_is_stopped(tmp_path):
    marker = f"popflow-forker-{uuid.uuid4().hex}"
    forker = (
        "import os, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "open('left.pid', 'w').write(str(os.getpid()))\\n"
        "while True:\\n"
        "    time.sleep(0.2)\\n"
        "    if os.fork():\\n"
        "        os._exit(0)\\n"
    )
    result, _ = inner_run(
        tmp_path,
        f"""
        import subprocess, sys, time

        def test_leaves_a_forker():
            subprocess.Popen([sys.executable, "-c", "{forker}", "{marker}"], start_new_session=True)
            while True:
                try:
                    if open("left.pid").read():
                        break
                except FileNotFoundError:
                    time.sleep(0.01)
        """,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*the suite left * process(es) running*"])
    assert running_with(marker) == []


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "text"),
    [(".env", "PREFECT_API_URL=http://127.0.0.1:9/api\n"), ("prefect.toml", "[api]\nurl = 'x'\n")],
)
def test_a_run_where_prefect_would_read_the_users_settings_is_refused(tmp_path, name, text):
    """Prefect reads ``.env`` and ``prefect.toml`` in the working folder ahead of any
    profile: the suite would talk to the user's own server."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / name).write_text(text)
    result, _ = inner_run(tmp_path, "def test_x():\n    pass\n")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines([f"*{folder / name}*", "*move them aside*"])


@pytest.mark.integration
@pytest.mark.parametrize("watched", ["~/.prefect", "PREFECT_HOME"])
def test_a_change_to_either_of_the_users_prefect_homes_fails_the_run(tmp_path, watched):
    """A user with ``PREFECT_HOME`` set has two homes to keep: theirs, and ``~/.prefect``,
    where a script that loses ``PREFECT_HOME`` writes."""
    home = tmp_path / "user"
    (home / ".prefect").mkdir(parents=True)
    (home / "custom").mkdir()
    (home / "elsewhere").mkdir()
    (home / "elsewhere" / "prefect.db").write_text("runs")
    (home / "custom" / "prefect.db").symlink_to(home / "elsewhere" / "prefect.db")
    target = {
        "~/.prefect": home / ".prefect" / "x",
        "PREFECT_HOME": home / "elsewhere" / "prefect.db",
    }
    result, _ = inner_run(
        tmp_path,
        f"def test_writes():\n    open({str(target[watched])!r}, 'a').write('more')\n",
        PREFECT_HOME=str(home / "custom"),
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    changed = {
        "~/.prefect": (home / ".prefect", "added x"),
        "PREFECT_HOME": (home / "custom", "changed prefect.db"),
    }
    where, line = changed[watched]
    result.stdout.fnmatch_lines(
        [f"*the suite changed the user's Prefect home {where} *", f"*{line}*"]
    )


def pytest_command(folder: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", f"--basetemp={folder / 'basetemp'}", "-q",
            "-p", "no:cacheprovider", "-p", "support.leftovers"]  # fmt: skip


def inner_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    (tmp_path / "user").mkdir(exist_ok=True)
    return {**as_user(tmp_path / "user", **settings), "PYTHONPATH": TESTS}


@pytest.mark.integration
def test_what_ran_below_pytest_before_it_began_is_not_the_suites(tmp_path):
    """A shell (a container's entrypoint) starts the user's server, then ``exec``s
    pytest: the server is pytest's child, but not the suite's; it is left running."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_tests(folder, test_inner="def test_nothing():\n    pass\n")
    marker = f"users-own-server-{uuid.uuid4().hex}"
    script = f'exec -a {marker} sleep 600 >/dev/null 2>&1 & echo $! > users.pid; exec "$@"'
    done = subprocess.run(
        ["bash", "-c", script, "bash", *pytest_command(folder)],
        cwd=folder, env=inner_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    users = int((folder / "users.pid").read_text())
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "left behind" not in done.stdout
        assert alive(users)
    finally:
        os.kill(users, 9)


@pytest.mark.integration
def test_a_daemon_a_conftest_starts_as_it_is_imported_is_the_suites(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    marker = f"conftest-daemon-{uuid.uuid4().hex}"
    write_tests(
        folder,
        conftest=f"import subprocess\nsubprocess.run(['bash', '-c', 'exec -a {marker} sleep 600 &'])\n",
        test_inner="def test_nothing():\n    pass\n",
    )
    result = run_pytest(folder, "-p", "support.leftovers", env=inner_env(tmp_path))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"*started during the session's start*{marker}*"])
    assert running_with(marker) == []


@pytest.mark.integration
def test_a_service_a_conftest_stops_as_pytest_ends_is_not_left(tmp_path):
    """A conftest may stop what it started in its own ``pytest_unconfigure``; loky's
    reusable workers (joblib) end with pytest."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_tests(
        folder,
        conftest=f"""
        import subprocess, sys

        def pytest_configure(config):
            config.service = subprocess.Popen({SLEEPER})

        def pytest_unconfigure(config):
            config.service.terminate()
            config.service.wait()
        """,
        test_inner="""
        from joblib import Parallel, delayed

        def test_joblib():
            assert Parallel(n_jobs=2)(delayed(abs)(-i) for i in range(4)) == [0, 1, 2, 3]
        """,
    )
    result = run_pytest(folder, "-p", "support.leftovers", env=inner_env(tmp_path))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    assert "left behind" not in result.stdout.str()


@pytest.mark.integration
def test_lowercase_prefect_settings_are_the_users_too(tmp_path):
    """Prefect reads ``prefect_api_url`` as ``PREFECT_API_URL``: the suite must not."""
    result, _ = inner_run(
        tmp_path,
        """
        import os
        from support.scripts import embedded_env

        def test_no_setting_of_the_users():
            mine = {k for k in os.environ if k.upper().startswith("PREFECT_")}
            assert mine == {"PREFECT_HOME"}
            env = embedded_env(os.environ["PREFECT_HOME"], {"prefect_api_url": "x", "A": "1"})
            assert env["A"] == "1" and "prefect_api_url" not in env
        """,
        prefect_api_url="http://127.0.0.1:9/api",
        prefect_server_database_connection_url="sqlite+aiosqlite:////nowhere/prefect.db",
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()


@pytest.mark.integration
def test_a_process_that_forks_every_two_milliseconds_is_found_and_stopped(tmp_path):
    marker = f"popflow-hopper-{uuid.uuid4().hex}"
    hopper = (
        "import os, signal, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "open('started', 'w').close()\\n"
        "while True:\\n"
        "    if os.fork():\\n"
        "        os._exit(0)\\n"
        "    time.sleep(0.002)\\n"
    )
    result, _ = inner_run(
        tmp_path,
        f"""
        import os, subprocess, sys, time

        def test_leaves_a_hopper():
            subprocess.Popen([sys.executable, "-c", "{hopper}", "{marker}"], start_new_session=True)
            while not os.path.exists("started"):
                time.sleep(0.01)
        """,
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*the suite left * process(es) running*"])
    assert running_with(marker) == []


@pytest.mark.integration
def test_a_sigterm_to_pytest_ends_the_run_with_its_sweep(tmp_path):
    """A cancelled CI job or ``timeout`` sends SIGTERM: what the run left is stopped."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_tests(
        folder,
        test_inner=f"""
        import subprocess, sys, time

        def test_waits():
            proc = subprocess.Popen({SLEEPER}, start_new_session=True)
            open("left.pid", "w").write(str(proc.pid))
            time.sleep(600)
        """,
    )
    inner = subprocess.Popen(
        pytest_command(folder), cwd=folder, env=inner_env(tmp_path),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (folder / "left.pid").exists() and (folder / "left.pid").read_text(),
                 120, "the inner test's process")  # fmt: skip
        inner.terminate()
        out, _ = inner.communicate(timeout=120)
    finally:
        inner.kill()
    assert inner.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "what the suite left behind" in out, out
    assert not alive(int((folder / "left.pid").read_text()))


@pytest.mark.integration
def test_ctrl_c_during_the_sweep_does_not_stop_it(tmp_path):
    """A second Ctrl-C while the run waits for its processes once left them running."""
    folder = tmp_path / "run"
    folder.mkdir()
    write_tests(
        folder,
        conftest="""
        import os, signal
        from support import processes

        looks = processes.looks

        def interrupted_looks(find, n=3):  # Ctrl-C at each look for what the run left
            os.kill(os.getpid(), signal.SIGINT)
            return looks(find, n)

        processes.looks = interrupted_looks
        """,
        test_inner=f"""
        import subprocess, sys

        def test_leaves_one():
            proc = subprocess.Popen({SLEEPER}, start_new_session=True)
            open("left.pid", "w").write(str(proc.pid))
        """,
    )
    result = run_pytest(folder, "-p", "support.leftovers", env=inner_env(tmp_path))
    assert_left(result, folder, "test_inner.py::test_leaves_one (call)")


@pytest.mark.integration
def test_the_processes_of_quick_tests_are_each_named_with_their_own(tmp_path):
    """Several tests begin in one 10 ms tick: each process is named with the test that
    started it (it is first seen as that test ends), environment or not."""
    result, _ = inner_run(
        tmp_path,
        """
        import os, pytest

        @pytest.mark.parametrize("i", range(12))
        def test_starts(i):
            os.posix_spawn("/bin/sleep", ["sleep", str(600 + i)], {"PATH": "/bin"})

        @pytest.mark.parametrize("i", range(12))
        def test_nothing(i):
            pass
        """,
    )
    out = result.stdout.str()
    for i in range(12):
        assert f"started during test_inner.py::test_starts[{i}] (call)" in out, out
        assert (
            f"test_starts[{i}] (call), PREFECT_HOME=unset: ~/.prefect (the user's own): sleep {600 + i}"
            in out
        )


@pytest.mark.integration
def test_orphans_the_run_adopts_are_reaped(tmp_path):
    """pytest is their subreaper: an orphan that exits is its zombie until reaped."""
    result, _ = inner_run(
        tmp_path,
        """
        import os, subprocess, time, pytest

        @pytest.mark.parametrize("i", range(30))
        def test_orphans_one(i):
            subprocess.run(["sh", "-c", "(exec sleep 0.01 &) ; exit 0"], check=True)

        def zombies():
            out = []
            for tid in os.listdir(f"/proc/{os.getpid()}/task"):
                with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
                    out += f.read().split()
            def state(pid):
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        return f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    return "gone"
            return [p for p in out if state(p) == "Z"]

        def test_waits_for_them_to_exit():
            deadline = time.monotonic() + 60
            while len([p for p in os.listdir("/proc") if p.isdigit() and b"sleep\\x000.01" in
                       open(f"/proc/{p}/cmdline", "rb").read()]) and time.monotonic() < deadline:
                time.sleep(0.05)

        def test_none_is_left_a_zombie():
            assert zombies() == []
        """,
    )
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()

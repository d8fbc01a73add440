"""A process that ran popflow skips CPython's teardown collections, and only them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def exit_report(tmp_path, body: str) -> list[str]:
    """Run ``body`` in a fresh interpreter; the lines it wrote to ``out`` by its exit."""
    out = tmp_path / "out.txt"
    script = textwrap.dedent(
        f"""
        import atexit, gc
        OUT = {str(out)!r}
        def said(line):
            with open(OUT, "a") as f:
                f.write(line + "\\n")
        # registered first, so it runs after popflow's handler (atexit is LIFO)
        atexit.register(lambda: said(f"frozen at exit: {{gc.get_freeze_count() > 0}}"))
        """
    ) + textwrap.dedent(body)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    return out.read_text().splitlines()


@pytest.mark.system
def test_the_exit_handler_freezes_what_is_alive_after_finalising_garbage(tmp_path):
    lines = exit_report(
        tmp_path,
        """
        from popflow.infra.fast_exit import skip_teardown_collections

        class Cycle:
            def __del__(self):
                said("garbage finalised")

        c = Cycle()
        c.me = c  # unreachable after del: only a collection finalises it
        gc.disable()  # so no collection before the exit handler's
        del c
        skip_teardown_collections()
        skip_teardown_collections()  # once per process
        """,
    )
    assert lines == ["garbage finalised", "frozen at exit: True"]


@pytest.mark.system
def test_importing_popflow_alone_freezes_nothing(tmp_path):
    # the contrast: the check above can fail
    assert exit_report(tmp_path, "import popflow\n") == ["frozen at exit: False"]


@pytest.mark.integration
def test_run_registers_the_exit_handler(tune_env, monkeypatch):
    from trainables import parity_function

    from popflow import run
    from popflow.infra import fast_exit

    monkeypatch.setattr(fast_exit, "_registered", False)  # as in a fresh process
    run(parity_function, {"a": 1, "c": 1}, stop={"training_iteration": 1}, name="exit", **tune_env)
    assert fast_exit._registered

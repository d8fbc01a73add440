"""Ray Tune's user guide, snippet by snippet, on popflow with only its import lines changed:
a snippet that stops running fails CI.

The corpus (``tests/ray_user_guide/``: where each snippet comes from, and why some cannot run
here) and its runner are shared with ``benchmarks/ray_user_guide.py``, which also runs the
snippets on Ray itself. Each runnable snippet runs as a user would run it: a fresh process
on the embedded default (popflow's local Prefect server, a local Dask cluster), in its own
folder, which is also its ``HOME``. A snippet's own assertions (Ray's, or the guide's claims:
the catalogue's ``items`` column names the issue 44 items they check) are what fails it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from popflow.infra import local_server

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import ray_user_guide as guide  # noqa: E402 (benchmarks/ is not a package)

SNIPPETS = guide.catalogue()
RUNNABLE = [s for s in SNIPPETS if s.runnable]


@pytest.fixture(scope="module")
def prefect_home(tmp_path_factory):
    """The Prefect home the snippets share: its local server is started by the first run,
    as for a user, and stopped by its PID at the end."""
    home = tmp_path_factory.mktemp("ray-user-guide") / "prefect-home"
    yield home
    if home.exists():  # no snippet ran: no server to stop
        local_server.stop(home)


@pytest.mark.system
@pytest.mark.parametrize("snippet", RUNNABLE, ids=[s.path.stem for s in RUNNABLE])
def test_the_snippet_runs_on_popflow_with_only_its_imports_changed(snippet, prefect_home, tmp_path):
    run = guide.run_snippet(snippet, "popflow", tmp_path, prefect_home, timeout=300.0)
    output = Path(run["log"]).read_text()
    assert run["rc"] == 0, f"{run['error']}\n{output[-4000:]}"


@pytest.mark.unit
def test_the_catalogue_lists_every_snippet_once_and_says_what_ray_does_with_each():
    guide.check_catalogue(SNIPPETS)
    assert len({s.id for s in SNIPPETS}) == len(SNIPPETS)
    for s in SNIPPETS:
        assert s.on_ray != "unknown", s.id
        # a snippet CI does not run says what it needs; one Ray itself fails on says why
        assert s.needs == "-" or s.needs.strip(), s.id


@pytest.mark.unit
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.path.stem for s in SNIPPETS])
def test_only_the_import_lines_change(snippet):
    original = snippet.path.read_text()
    text, changed = guide.source_for(snippet, "popflow")
    assert len(text.splitlines()) == len(original.splitlines())
    for old, new in changed:
        assert old.lstrip().startswith(("from ray", "import ray")), old
        assert "popflow" in new, new
    kept = [a for a, b in zip(original.splitlines(), text.splitlines(), strict=True) if a == b]
    assert len(kept) == len(original.splitlines()) - len(changed)

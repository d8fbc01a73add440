"""The docstring examples of popflow's modules, run against the installed package.

pytest's ``--doctest-modules`` would import ``schedulers/pbt.py`` from the
checkout as a second module named ``schedulers.pbt``; here every example runs
in the module popflow itself imports (``popflow.schedulers.pbt``).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

pytestmark = pytest.mark.unit

LAYERS = ("popflow.schedulers", "popflow.tasks", "popflow.infra", "popflow.flows")
#: Modules not imported here: their frameworks (torch, Lightning, Keras) take seconds to
#: import on every collection, and Keras needs its backend named first. They hold no
#: docstring examples (``test_the_modules_left_out_have_no_examples``).
LEFT_OUT = ("popflow.tasks.lightning_report", "popflow.tasks.keras_report")


def _examples() -> list[tuple[str, str]]:
    found = []
    names = ["popflow"]
    for layer in LAYERS:
        package = importlib.import_module(layer)
        # walk_packages: the subpackages' modules too (flows.record.artifacts, infra.store...)
        names += [layer] + [i.name for i in pkgutil.walk_packages(package.__path__, f"{layer}.")]
    for name in names:
        if name in LEFT_OUT:
            continue
        module = importlib.import_module(name)
        for test in doctest.DocTestFinder().find(module):
            if test.examples:
                found.append((name, test.name))
    return sorted(found)


EXAMPLES = _examples()


def test_the_package_has_docstring_examples() -> None:
    assert len(EXAMPLES) >= 50, EXAMPLES


def test_the_modules_left_out_have_no_examples() -> None:
    for name in LEFT_OUT:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        with open(spec.origin, encoding="utf-8") as f:
            assert ">>>" not in f.read(), f"{name} has docstring examples: import it here"


@pytest.mark.parametrize(("module_name", "test_name"), EXAMPLES)
def test_docstring_example(module_name: str, test_name: str) -> None:
    module = importlib.import_module(module_name)
    (test,) = [t for t in doctest.DocTestFinder().find(module) if t.name == test_name]
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test)
    assert result.failed == 0, f"{test_name}: {result.failed} of {result.attempted} examples failed"

"""Module paths from before the subpackages still import: an experiment's stored run
arguments and a user's pickles name them (flows/moved_modules.py)."""

from __future__ import annotations

import importlib
import pickle

import pytest

from popflow.flows.experiment.results import ResultGrid
from popflow.flows.moved_modules import MOVED
from popflow.flows.spec.config import CheckpointConfig
from popflow.flows.spec.trainable_paths import import_path

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_each_old_module_name_imports_its_new_home(old, new):
    assert importlib.import_module(old) is importlib.import_module(new)


def test_a_class_path_stored_before_the_move_still_resolves():
    """run_args.json names a config's or callback's class as ``module:qualname``."""
    assert import_path("popflow.flows.config:CheckpointConfig") is CheckpointConfig


def test_a_pickle_naming_an_old_module_loads():
    """A ResultGrid class pickled before the move (pickle's GLOBAL opcode: module, name)."""
    assert pickle.loads(b"cpopflow.flows.results\nResultGrid\n.") is ResultGrid

"""What a callback reads of a ``Trial`` beyond its record, and a trainable of the
context's Train-only getters (Ray 2.60's answers under Tune)."""

from __future__ import annotations

import numpy as np
import pytest

from popflow.schedulers import Trial, TrialStatus
from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.search_space import grid_search
from popflow.schedulers.variants import resolve_variants
from popflow.tasks.trial_context import TuneContext

pytestmark = pytest.mark.unit


def test_evaluated_params_are_the_resolved_values_with_slash_keys():
    space = {"a": grid_search([1, 2]), "model": {"lr": grid_search([0.1])}, "c": 3}
    variants = resolve_variants(space, 1, np.random.default_rng(0))
    assert [v.evaluated_params for v in variants] == [
        {"a": 1, "model/lr": 0.1},
        {"a": 2, "model/lr": 0.1},
    ]


def test_a_trial_is_finished_once_terminated_or_errored():
    trial = Trial("t", {})
    assert not trial.is_finished()
    assert trial.placement_group_factory == PlacementGroupFactory([{"CPU": 1, "GPU": 0}])
    assert trial.checkpoint is None and trial.error_file is None
    assert trial.custom_trial_name is None
    for status, finished in ((TrialStatus.TERMINATED, True), (TrialStatus.ERROR, True)):
        trial.status = status
        assert trial.is_finished() is finished
    trial.custom_name = "mine"
    assert trial.custom_trial_name == "mine"


def test_train_only_getters_answer_none_with_a_deprecation_warning():
    context = TuneContext("t", "t", "/tmp/t", "e")
    for name in (
        "get_world_rank",
        "get_world_size",
        "get_local_rank",
        "get_local_world_size",
        "get_node_rank",
    ):
        with pytest.warns(DeprecationWarning, match=name):
            assert getattr(context, name)() is None
    with pytest.raises(DeprecationWarning, match="never been usable"):
        context.get_metadata()

"""Ray's ``Trainable.trial_resources``: a class trainable reads what its trial holds now, as a
function trainable reads ``tune.get_context().get_trial_resources()``."""

from __future__ import annotations

import pytest

from popflow.schedulers.placement import PlacementGroupFactory
from popflow.tasks.trainable import Trainable
from popflow.tasks.trial_context import TuneContext, bound

pytestmark = pytest.mark.unit


def test_a_class_trainable_reads_its_trials_resources():
    held = PlacementGroupFactory([{"CPU": 2}])
    context = TuneContext("t0", "t0", "/tmp/t0", "exp", trial_resources=held)
    trainable = Trainable({})
    assert trainable.trial_resources is None  # outside a trial
    with bound(context):
        assert trainable.trial_resources is held
        assert trainable.trial_resources.head_cpus == 2

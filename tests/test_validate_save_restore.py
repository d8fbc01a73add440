"""Ray's ``tune.utils.validate_save_restore``: a class that saves and restores correctly
passes; one that cannot save, or loses its state, is named."""

from __future__ import annotations

from typing import Any

import pytest
from trainables import ParityTrainable

from popflow import tune
from popflow.tune.utils import validate_save_restore

pytestmark = pytest.mark.unit


class NoSave(tune.Trainable):
    def step(self) -> dict[str, Any]:
        return {"x": 1}


class BadLoad(ParityTrainable):
    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        raise KeyError("a")


def test_a_class_that_resumes_correctly_passes():
    assert validate_save_restore(ParityTrainable, {"a": 0.5}) is True


@pytest.mark.parametrize(
    ("trainable", "match"),
    [
        (NoSave, "(?s)NoSave failed to train:.*must implement save_checkpoint"),
        (BadLoad, "BadLoad failed to restore"),
    ],
)
def test_a_class_that_cannot_save_or_restore_is_named(trainable, match):
    with pytest.raises(AssertionError, match=match):
        validate_save_restore(trainable, {"a": 0.5})


def test_a_function_trainable_is_refused():
    with pytest.raises(TypeError, match="Trainable class"):
        validate_save_restore(lambda config: None)

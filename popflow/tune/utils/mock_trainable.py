"""``ray.tune.utils.mock_trainable``: a stand-in trainable for examples and tests.

:class:`MyTrainableClass` climbs a sigmoid: after ``t`` steps it reports
``episode_reward_mean = height * tanh(t / width)`` (``width`` and ``height``
from the config, 1 by default), sleeping ``sleep`` seconds per step. With
``mock_error`` it fails after its first step, once (or every time, with
``persistent_error``), to exercise retries.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from popflow.tasks import Trainable

MOCK_ERROR_KEY = "mock_error"


class MyTrainableClass(Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.timestep = 0
        self.restored = False

    def step(self) -> dict[str, Any]:
        config = self.config
        fails = config.get(MOCK_ERROR_KEY, False) and self.timestep > 0
        if fails and (config.get("persistent_error", False) or not self.restored):
            raise RuntimeError(f"failing on purpose at timestep {self.timestep}")
        if config.get("sleep", 0) > 0:
            time.sleep(config["sleep"])
        self.timestep += 1
        reward = config.get("height", 1) * math.tanh(self.timestep / config.get("width", 1))
        return {"episode_reward_mean": reward}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "checkpoint"), "w") as f:
            json.dump({"timestep": self.timestep}, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "checkpoint")) as f:
            self.timestep = json.load(f)["timestep"]
        self.restored = True

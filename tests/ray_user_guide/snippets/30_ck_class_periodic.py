# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-trial-checkpoints.md
# code:    doc_code/trial_checkpoint.py (index file id 4986492455; tune.report / tune.Checkpoint form)
# markers: __class_api_periodic_checkpointing_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (MyTrainableClass from __class_api_checkpointing_start__ (its Tuner run included)) ---
import os
import torch
from torch import nn

from ray import tune


class MyTrainableClass(tune.Trainable):
    def setup(self, config):
        self.model = nn.Sequential(
            nn.Linear(config.get("input_size", 32), 32), nn.ReLU(), nn.Linear(32, 10)
        )

    def step(self):
        return {}

    def save_checkpoint(self, tmp_checkpoint_dir):
        checkpoint_path = os.path.join(tmp_checkpoint_dir, "model.pth")
        torch.save(self.model.state_dict(), checkpoint_path)
        return tmp_checkpoint_dir

    def load_checkpoint(self, tmp_checkpoint_dir):
        checkpoint_path = os.path.join(tmp_checkpoint_dir, "model.pth")
        self.model.load_state_dict(torch.load(checkpoint_path))


tuner = tune.Tuner(
    MyTrainableClass,
    param_space={"input_size": 64},
    run_config=tune.RunConfig(
        stop={"training_iteration": 2},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2),
    ),
)
tuner.fit()

# --- snippet (as the guide shows it) ---

tuner = tune.Tuner(
    MyTrainableClass,
    run_config=tune.RunConfig(
        stop={"training_iteration": 2},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=10),
    ),
)
tuner.fit()


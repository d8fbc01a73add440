# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-trial-checkpoints.md
# code:    doc_code/trial_checkpoint.py (index file id 4986492455; tune.report / tune.Checkpoint form)
# markers: __function_api_checkpointing_from_dir_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (trial_checkpoint.py: torch import and MyModel) ---
import torch


class MyModel:
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict):
        pass

# --- snippet (as the guide shows it) ---
import os
import tempfile

from ray import tune
from ray.tune import Checkpoint


def train_func(config):
    start = 1
    my_model = MyModel()

    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            checkpoint_dict = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
            start = checkpoint_dict["epoch"] + 1
            my_model.load_state_dict(checkpoint_dict["model_state"])

    for epoch in range(start, config["epochs"] + 1):
        # Model training here
        # ...

        metrics = {"metric": 1}
        with tempfile.TemporaryDirectory() as tempdir:
            torch.save(
                {"epoch": epoch, "model_state": my_model.state_dict()},
                os.path.join(tempdir, "checkpoint.pt"),
            )
            tune.report(metrics=metrics, checkpoint=Checkpoint.from_directory(tempdir))


tuner = tune.Tuner(train_func, param_space={"epochs": 5})
result_grid = tuner.fit()

# --- epilogue: not shown in the guide (trial_checkpoint.py's own assertion) ---
assert not result_grid.errors

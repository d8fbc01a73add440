# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-trial-checkpoints.md
# code:    doc_code/trial_checkpoint.py (index file id 4986492455; tune.report / tune.Checkpoint form)
# markers: __function_api_checkpointing_periodic_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (imports from the previous block) ---
import tempfile
from ray import tune
from ray.tune import Checkpoint

# --- snippet (as the guide shows it) ---
NUM_EPOCHS = 12
# checkpoint every three epochs.
CHECKPOINT_FREQ = 3


def train_func(config):
    for epoch in range(1, config["epochs"] + 1):
        # Model training here
        # ...

        # Report metrics and save a checkpoint
        metrics = {"metric": "my_metric"}
        if epoch % CHECKPOINT_FREQ == 0:
            with tempfile.TemporaryDirectory() as tempdir:
                # Save a checkpoint in tempdir.
                tune.report(metrics, checkpoint=Checkpoint.from_directory(tempdir))
        else:
            tune.report(metrics)


tuner = tune.Tuner(train_func, param_space={"epochs": NUM_EPOCHS})
result_grid = tuner.fit()

# --- epilogue: not shown in the guide (trial_checkpoint.py's own assertions) ---
assert not result_grid.errors
assert len(result_grid[0].best_checkpoints) == NUM_EPOCHS // CHECKPOINT_FREQ

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-trial-checkpoints.md
# code:    doc_code/trial_checkpoint.py (index file id 4986492455; tune.report / tune.Checkpoint form)
# markers: __callback_api_checkpointing_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
from ray import tune
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME
from ray.tune.experiment import Trial


class CheckpointByStepsTaken(tune.Callback):
    def __init__(self, steps_per_checkpoint: int):
        self.steps_per_checkpoint = steps_per_checkpoint
        self._trials_last_checkpoint = {}

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict, **info
    ):
        current_step = result[ENV_RUNNER_RESULTS][NUM_ENV_STEPS_SAMPLED_LIFETIME]
        if (
            current_step - self._trials_last_checkpoint.get(trial, -1)
            >= self.steps_per_checkpoint
        ):
            trial.checkpoint_now()
            self._trials_last_checkpoint[trial] = current_step



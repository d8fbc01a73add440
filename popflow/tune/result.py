"""``ray.tune.result``: the result keys Ray Tune gives meaning to.

from popflow.tune.result import SHOULD_CHECKPOINT
class Checkpointing(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["mean_loss"] < 0.1:
            result[SHOULD_CHECKPOINT] = True  # the trial saves at this result
"""

from popflow.tasks.result_keys import (
    DEFAULT_METRIC,
    DONE,
    EPISODE_REWARD_MEAN,
    EPISODES_THIS_ITER,
    EPISODES_TOTAL,
    EXPERIMENT_TAG,
    MEAN_ACCURACY,
    MEAN_LOSS,
    SHOULD_CHECKPOINT,
    TIME_THIS_ITER_S,
    TIME_TOTAL_S,
    TIMESTEPS_THIS_ITER,
    TIMESTEPS_TOTAL,
    TRAINING_ITERATION,
    TRIAL_ID,
)

__all__ = [
    "DEFAULT_METRIC",
    "DONE",
    "EPISODES_THIS_ITER",
    "EPISODES_TOTAL",
    "EPISODE_REWARD_MEAN",
    "EXPERIMENT_TAG",
    "MEAN_ACCURACY",
    "MEAN_LOSS",
    "SHOULD_CHECKPOINT",
    "TIMESTEPS_THIS_ITER",
    "TIMESTEPS_TOTAL",
    "TIME_THIS_ITER_S",
    "TIME_TOTAL_S",
    "TRAINING_ITERATION",
    "TRIAL_ID",
]

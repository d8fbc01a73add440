"""The result keys Ray Tune gives meaning to (``ray.tune.result``), in one place for the
worker and the driver."""

from popflow.schedulers.search.searcher import DEFAULT_METRIC

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

#: a trial's result saying it is finished
DONE = "done"
#: a result with this key true asks for a checkpoint of the trial at that result: set
#: by the trainable's ``step()``, or by a driver-side callback's ``on_trial_result``
SHOULD_CHECKPOINT = "should_checkpoint"
TRAINING_ITERATION = "training_iteration"
TIME_THIS_ITER_S = "time_this_iter_s"
TIME_TOTAL_S = "time_total_s"
TIMESTEPS_TOTAL = "timesteps_total"
TIMESTEPS_THIS_ITER = "timesteps_this_iter"
EPISODE_REWARD_MEAN = "episode_reward_mean"
EPISODES_TOTAL = "episodes_total"
EPISODES_THIS_ITER = "episodes_this_iter"
MEAN_LOSS = "mean_loss"
MEAN_ACCURACY = "mean_accuracy"
TRIAL_ID = "trial_id"
EXPERIMENT_TAG = "experiment_tag"

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-stopping.md
# code:    doc_code/stopping.py @ 46d5d6834194 (train.report / train.RunConfig form)
# markers: __early_stopping_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (stopping.py redefines my_trainable without the sleep for its tests) ---
import time
from ray import tune


def my_trainable(config):
    i = 1
    while True:
        tune.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1

# --- snippet (as the guide shows it) ---
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler


scheduler = AsyncHyperBandScheduler(time_attr="training_iteration")

tuner = tune.Tuner(
    my_trainable,
    run_config=tune.RunConfig(stop={"training_iteration": 10}),
    tune_config=tune.TuneConfig(
        scheduler=scheduler, num_samples=2, metric="mean_accuracy", mode="max"
    ),
)
result_grid = tuner.fit()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-search-spaces.md
# code:    inline ```python block 4
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: the names it leaves undefined) ---
import numpy as np
from ray import tune
from ray.tune import RunConfig


def trainable(config):
    tune.report({"score": 1})


my_trainable = trainable

# --- snippet (as the guide shows it) ---
# 6 different configs.
tuner = tune.Tuner(trainable, tune_config=tune.TuneConfig(num_samples=2), param_space={
    "x": tune.sample_from(...),
    "y": tune.grid_search([a, b, c])
    }
)
tuner.fit()

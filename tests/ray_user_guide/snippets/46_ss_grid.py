# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-search-spaces.md
# code:    inline ```python block 1
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
tuner = tune.Tuner(
    trainable,
    param_space={"bar": tune.grid_search([True, False])})
results = tuner.fit()

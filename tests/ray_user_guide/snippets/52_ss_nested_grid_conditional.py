# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-search-spaces.md
# code:    inline code-block (emphasize-lines: 4-11; 9 trials)
# markers: -
# kind:    code-block

# --- prelude: not shown in the guide (not in the guide: the names it leaves undefined) ---
import numpy as np
from ray import tune
from ray.tune import RunConfig


def trainable(config):
    tune.report({"score": 1})


my_trainable = trainable

# --- snippet (as the guide shows it) ---
tuner = tune.Tuner(
    my_trainable,
    run_config=RunConfig(name="my_trainable"),
    param_space={
        "alpha": tune.sample_from(lambda _: np.random.uniform(100)),
        "beta": tune.sample_from(lambda config: config["alpha"] * np.random.normal()),
        "nn_layers": [
            tune.grid_search([16, 64, 256]),
            tune.grid_search([16, 64, 256]),
        ],
    }
)

# --- epilogue: not shown in the guide (not in the guide: run it) ---
tuner.fit()

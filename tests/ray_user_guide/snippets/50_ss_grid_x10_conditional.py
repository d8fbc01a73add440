# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-search-spaces.md
# code:    inline code-block (emphasize-lines: 12; 90 trials)
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
    run_config=tune.RunConfig(name="my_trainable"),
    # num_samples will repeat the entire config 10 times.
    tune_config=tune.TuneConfig(num_samples=10),
    param_space={
        # ``sample_from`` creates a generator to call the lambda once per trial.
        "alpha": tune.sample_from(lambda _: np.random.uniform(100)),
        # ``sample_from`` also supports "conditional search spaces"
        "beta": tune.sample_from(lambda config: config["alpha"] * np.random.normal()),
        "nn_layers": [
            # tune.grid_search will make it so that all values are evaluated.
            tune.grid_search([16, 64, 256]),
            tune.grid_search([16, 64, 256]),
        ],
    },
)
tuner.fit()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __reproducible_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
import numpy as np
from ray import tune
from ray.train import ScalingConfig


def train_func(config):
    # Set seed for trainable random result.
    # If you remove this line, you will get different results
    # each time you run the trial, even if the configuration
    # is the same.
    np.random.seed(config["seed"])
    random_result = np.random.uniform(0, 100, size=1).item()
    tune.report({"result": random_result})


# Set seed for Ray Tune's random search.
# If you remove this line, you will get different configurations
# each time you run the script.
np.random.seed(1234)
tuner = tune.Tuner(
    train_func,
    tune_config=tune.TuneConfig(
        num_samples=10,
        search_alg=tune.search.BasicVariantGenerator(),
    ),
    param_space={"seed": tune.randint(0, 1000)},
)
tuner.fit()

# --- epilogue: not shown in the guide (corpus check of the FAQ's claim (issue 44 item 3): the same seed gives the same configs) ---
first = sorted(r.config["seed"] for r in tuner.get_results())
np.random.seed(1234)
tuner = tune.Tuner(
    train_func,
    tune_config=tune.TuneConfig(num_samples=10, search_alg=tune.search.BasicVariantGenerator()),
    param_space={"seed": tune.randint(0, 1000)},
)
assert sorted(r.config["seed"] for r in tuner.fit()) == first

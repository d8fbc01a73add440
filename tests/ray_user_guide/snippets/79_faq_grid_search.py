# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __grid_search_start__ .. _end__ (:dedent:)
# kind:    literalinclude

# --- prelude: not shown in the guide (faq.py's imports and train_fn) ---
import numpy as np
from ray import tune


def train_func(config):
    random_result = np.random.uniform(0, 100, size=1).item()
    tune.report({"result": random_result})


train_fn = train_func

# --- snippet (as the guide shows it) ---
parameters = {
    "qux": tune.sample_from(lambda spec: 2 + 2),
    "bar": tune.grid_search([True, False]),
    "foo": tune.grid_search([1, 2, 3]),
    "baz": "asd",  # a constant value
}

tuner = tune.Tuner(train_fn, param_space=parameters)
tuner.fit()

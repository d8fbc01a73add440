# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __modin_start__ .. __modin_end__ (:dedent:; under MOCK=True in faq.py: never run by Ray's CI)
# kind:    literalinclude

# --- prelude: not shown in the guide (faq.py's imports and train_fn) ---
import numpy as np
from ray import tune


def train_func(config):
    random_result = np.random.uniform(0, 100, size=1).item()
    tune.report({"result": random_result})


train_fn = train_func
metric = None

# --- snippet (as the guide shows it) ---
def train_fn(config):
    # some Modin operations here
    # import modin.pandas as pd
    tune.report({"metric": metric})

tuner = tune.Tuner(
    tune.with_resources(
        train_fn,
        resources=tune.PlacementGroupFactory(
            [
                {"CPU": 1},  # this bundle will be used by the trainable itself
                {"CPU": 1},  # this bundle will be used by Modin
            ],
            strategy="PACK",
        ),
    )
)
tuner.fit()

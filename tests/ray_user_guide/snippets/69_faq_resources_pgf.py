# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __resources_pgf_start__ .. __resources_pgf_end__ (:dedent:; under MOCK=True in faq.py: never run by Ray's CI)
# kind:    literalinclude

# --- prelude: not shown in the guide (faq.py's imports and train_fn) ---
import numpy as np
from ray import tune


def train_func(config):
    random_result = np.random.uniform(0, 100, size=1).item()
    tune.report({"result": random_result})


train_fn = train_func

# --- snippet (as the guide shows it) ---
tuner = tune.Tuner(
    tune.with_resources(
        train_fn,
        resources=tune.PlacementGroupFactory(
            [
                {"CPU": 2, "GPU": 0.5, "hdd": 80},
                {"CPU": 1},
                {"CPU": 1},
            ],
            strategy="PACK",
        ),
    )
)
tuner.fit()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/api/trainable.rst
# code:    api/trainable.rst inline (Advanced Resource Allocation)
# markers: -
# kind:    code-block

# --- prelude: not shown in the guide (not in the guide: the names it uses) ---
from ray import tune
from ray.tune import RunConfig


def my_trainable(config):
    tune.report({"x": 1})

# --- snippet (as the guide shows it) ---
tuner = tune.Tuner(
    tune.with_resources(my_trainable, tune.PlacementGroupFactory([
        {"CPU": 1, "GPU": 1},
        {"GPU": 1},
        {"GPU": 1},
        {"GPU": 1},
        {"GPU": 1}
    ])),
    run_config=RunConfig(name="my_trainable")
)

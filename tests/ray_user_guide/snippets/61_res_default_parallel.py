# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-resources.md
# code:    inline ```python block 1
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: the trainable it leaves undefined) ---
from ray import tune


def trainable(config):
    tune.report({"score": 1})

# --- snippet (as the guide shows it) ---
# If you have 4 CPUs on your machine, this will run 4 concurrent trials at a time.
tuner = tune.Tuner(
    trainable,
    tune_config=tune.TuneConfig(num_samples=10)
)
results = tuner.fit()

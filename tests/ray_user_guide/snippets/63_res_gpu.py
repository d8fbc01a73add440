# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-resources.md
# code:    inline ```python block 3 (GPUs)
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: the trainable it leaves undefined) ---
from ray import tune


def trainable(config):
    tune.report({"score": 1})

# --- snippet (as the guide shows it) ---
# If you have 8 GPUs, this will run 8 trials at once.
trainable_with_gpu = tune.with_resources(trainable, {"gpu": 1})
tuner = tune.Tuner(
    trainable_with_gpu,
    tune_config=tune.TuneConfig(num_samples=10)
)
results = tuner.fit()

# If you have 4 CPUs and 1 GPU on your machine, this will run 1 trial at a time.
trainable_with_cpu_gpu = tune.with_resources(trainable, {"cpu": 2, "gpu": 1})
tuner = tune.Tuner(
    trainable_with_cpu_gpu,
    tune_config=tune.TuneConfig(num_samples=10)
)
results = tuner.fit()

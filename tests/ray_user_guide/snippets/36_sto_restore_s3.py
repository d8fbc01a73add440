# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-storage.md
# code:    inline ```python block 5 (restore from cloud)
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: a trainable for the guide's `trainable`/`my_trainable`) ---
from ray import tune


def my_trainable(config):
    for i in range(3):
        tune.report({"score": i})

# --- snippet (as the guide shows it) ---
from ray import tune
tuner = tune.Tuner.restore(
    "s3://my-checkpoints-bucket/path/my-tune-exp",
    trainable=my_trainable,
    resume_errored=True,
)
tuner.fit()

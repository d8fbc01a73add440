# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-fault-tolerance.md
# code:    inline ```python block (tip: restore from a cloud bucket)
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: a trainable for the guide's `trainable`/`my_trainable`) ---
from ray import tune


def trainable(config):
    for i in range(3):
        tune.report({"score": i})

# --- snippet (as the guide shows it) ---
tuner = tune.Tuner.restore(
    path="s3://cloud-bucket/tune_fault_tolerance_guide", trainable=trainable
)

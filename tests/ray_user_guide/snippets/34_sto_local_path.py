# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-storage.md
# code:    inline ```python block 3 (single node)
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: a trainable for the guide's `trainable`/`my_trainable`) ---
from ray import tune


def trainable(config):
    for i in range(3):
        tune.report({"score": i})

# --- snippet (as the guide shows it) ---
from ray import tune

tuner = tune.Tuner(
    trainable,
    run_config=tune.RunConfig(
        storage_path="/tmp/custom/storage/path",
        name="experiment_name",
    )
)
tuner.fit()

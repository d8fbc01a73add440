# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-stopping.md
# code:    doc_code/stopping.py @ 46d5d6834194 (train.report / train.RunConfig form)
# markers: __stopping_dict_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (stopping.py redefines my_trainable without the sleep for its tests) ---
import time
from ray import tune


def my_trainable(config):
    i = 1
    while True:
        tune.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1

# --- snippet (as the guide shows it) ---
from ray import tune

tuner = tune.Tuner(
    my_trainable,
    run_config=tune.RunConfig(stop={"training_iteration": 10, "mean_accuracy": 0.8}),
)
result_grid = tuner.fit()

# --- epilogue: not shown in the guide (stopping.py's own assertion) ---
final_iter = result_grid[0].metrics["training_iteration"]
assert final_iter == 8, final_iter

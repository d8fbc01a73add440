# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-stopping.md
# code:    doc_code/stopping.py @ 46d5d6834194 (train.report / train.RunConfig form)
# markers: __stopping_trials_by_time_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (stopping.py's sleeping my_trainable for the time-based blocks) ---
import time
from ray import tune


def my_trainable(config):
    i = 1
    while True:
        time.sleep(1)
        tune.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1

# --- snippet (as the guide shows it) ---
from ray import tune

tuner = tune.Tuner(
    my_trainable,
    # Stop a trial after it's run for more than 5 seconds.
    run_config=tune.RunConfig(stop={"time_total_s": 5}),
)
result_grid = tuner.fit()

# --- epilogue: not shown in the guide (stopping.py's own assertion: ~5 reports) ---
assert result_grid[0].metrics["training_iteration"] < 8

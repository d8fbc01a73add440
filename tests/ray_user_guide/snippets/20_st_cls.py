# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-stopping.md
# code:    doc_code/stopping.py @ 46d5d6834194 (train.report / train.RunConfig form)
# markers: __stopping_cls_start__ .. _end__
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
from ray.tune import Stopper


class CustomStopper(Stopper):
    def __init__(self):
        self.should_stop = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        if not self.should_stop and result["mean_accuracy"] >= 0.8:
            self.should_stop = True
        return self.should_stop

    def stop_all(self) -> bool:
        """Returns whether to stop trials and prevent new ones from starting."""
        return self.should_stop


stopper = CustomStopper()
tuner = tune.Tuner(
    my_trainable,
    run_config=tune.RunConfig(stop=stopper),
    tune_config=tune.TuneConfig(num_samples=2),
)
result_grid = tuner.fit()

# --- epilogue: not shown in the guide (stopping.py's own assertion) ---
for result in result_grid:
    final_iter = result.metrics.get("training_iteration", 0)
    assert final_iter <= 8, final_iter

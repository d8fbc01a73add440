# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-output.md
# code:    inline ```python block 5 (log_to_file=str / (out, err))
# markers: -
# kind:    python block

# --- prelude: not shown in the guide (not in the guide: the names it leaves undefined) ---
from ray import tune
from ray.tune import RunConfig


def trainable(config):
    print("to stdout")
    import sys; print("to stderr", file=sys.stderr)
    tune.report({"score": 1})


class MyTrainableClass(tune.Trainable):
    def step(self):
        return {"score": 1, "done": self.iteration >= 2}

# --- snippet (as the guide shows it) ---
tuner = tune.Tuner(
    trainable,
    run_config=RunConfig(log_to_file="std_combined.log")
)
tuner.fit()

tuner = tune.Tuner(
    trainable,
    run_config=RunConfig(log_to_file=("my_stdout.log", "my_stderr.log")))
results = tuner.fit()

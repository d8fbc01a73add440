# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-output.md
# code:    inline ```python block 4 (log_to_file=True)
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
    run_config=RunConfig(log_to_file=True)
)
results = tuner.fit()

# --- epilogue: not shown in the guide (corpus check of the guide's claim: trial_logdir/stdout and trial_logdir/stderr (issue 44 item 8)) ---
import os
for r in results:
    assert "to stdout" in open(os.path.join(r.path, "stdout")).read()
    assert "to stderr" in open(os.path.join(r.path, "stderr")).read()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/api/trainable.rst
# code:    doc_code/trainable.py (index file id 2444490841; train.report form)
# markers: __class_api_example_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (__example_objective_start__ block) ---
def objective(x, a, b):
    return a * (x ** 0.5) + b

# --- snippet (as the guide shows it) ---
from ray import tune


class Trainable(tune.Trainable):
    def setup(self, config: dict):
        # config (dict): A dict of hyperparameters
        self.x = 0
        self.a = config["a"]
        self.b = config["b"]

    def step(self):  # This is called iteratively.
        score = objective(self.x, self.a, self.b)
        self.x += 1
        return {"score": score}


tuner = tune.Tuner(
    Trainable,
    run_config=tune.RunConfig(
        # Train for 20 steps
        stop={"training_iteration": 20},
        checkpoint_config=tune.CheckpointConfig(
            # We haven't implemented checkpointing yet. See below!
            checkpoint_at_end=False
        ),
    ),
    param_space={"a": 2, "b": 4},
)
results = tuner.fit()

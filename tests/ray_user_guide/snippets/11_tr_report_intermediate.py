# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/api/trainable.rst
# code:    doc_code/trainable.py (index file id 2444490841; train.report form)
# markers: __function_api_report_intermediate_metrics_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (__example_objective_start__ block) ---
def objective(x, a, b):
    return a * (x ** 0.5) + b

# --- snippet (as the guide shows it) ---
from ray import tune


def trainable(config: dict):
    intermediate_score = 0
    for x in range(20):
        intermediate_score = objective(x, config["a"], config["b"])
        tune.report({"score": intermediate_score})  # This sends the score to Tune.


tuner = tune.Tuner(trainable, param_space={"a": 2, "b": 4})
results = tuner.fit()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/api/trainable.rst
# code:    doc_code/trainable.py (index file id 2444490841; train.report form)
# markers: __function_api_return_final_metrics_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (__example_objective_start__ block) ---
def objective(x, a, b):
    return a * (x ** 0.5) + b

# --- snippet (as the guide shows it) ---
def trainable(config: dict):
    final_score = 0
    for x in range(20):
        final_score = objective(x, config["a"], config["b"])

    return {"score": final_score}  # This sends the score to Tune.

# --- epilogue: not shown in the guide (corpus check of the guide's claim 'return a final set of metrics to Tune' (issue 44 item 1)) ---
from ray import tune

results = tune.Tuner(trainable, param_space={"a": 2, "b": 4}).fit()
assert not results.errors
assert results[0].metrics["score"] == objective(19, 2, 4), results[0].metrics

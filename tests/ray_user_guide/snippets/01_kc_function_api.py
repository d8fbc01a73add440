# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/key-concepts.md
# code:    doc_code/key_concepts.py @ 0500928dcde1 (tune.report / tune.RunConfig form)
# markers: __function_api_start__ .. __function_api_end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
from ray import train


def objective(x, a, b):  # Define an objective function.
    return a * (x ** 2) + b


def trainable(config):  # Pass a "config" dictionary into your trainable.

    for x in range(20):  # "Train" for 20 iterations and compute intermediate scores.
        score = objective(x, config["a"], config["b"])

        tune.report({"score": score})  # Send the score to Tune.



# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-stopping.md
# code:    doc_code/stopping.py @ 46d5d6834194 (train.report / train.RunConfig form)
# markers: __stopping_example_trainable_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
from ray import tune


def my_trainable(config):
    i = 1
    while True:
        # Do some training...
        time.sleep(1)

        # Report some metrics for demonstration...
        tune.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1

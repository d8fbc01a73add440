# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-trial-checkpoints.md
# code:    doc_code/trial_checkpoint.py (index file id 4986492455; tune.report / tune.Checkpoint form)
# markers: __class_api_manual_checkpointing_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
import random


# to be implemented by user.
def detect_instance_preemption():
    choice = random.randint(1, 100)
    # simulating a 1% chance of preemption.
    return choice <= 1


def train_func(self):
    # training code
    result = {"mean_accuracy": "my_accuracy"}
    if detect_instance_preemption():
        result.update(should_checkpoint=True)
    return result



# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/faq.md
# code:    doc_code/faq.py @ 001716f97ea2 (train.report / train.RunConfig form)
# markers: __no_chdir_start__ .. _end__ (:dedent:; under MOCK=True in faq.py)
# kind:    literalinclude

# --- prelude: not shown in the guide (faq.py's imports) ---
import os
from pathlib import Path
from ray import tune

# --- snippet (as the guide shows it) ---
def train_func(config):
    # Read from relative paths
    print(open("./read.txt").read())

    # The working directory shouldn't have changed from the original
    # NOTE: The `TUNE_ORIG_WORKING_DIR` environment variable is deprecated.
    assert os.getcwd() == os.environ["TUNE_ORIG_WORKING_DIR"]

    # Write to the Tune trial directory, not the shared working dir
    tune_trial_dir = Path(tune.get_context().get_trial_dir())
    with open(tune_trial_dir / "write.txt", "w") as f:
        f.write("trial saved artifact")

tuner = tune.Tuner(
    train_func,
    tune_config=tune.TuneConfig(..., chdir_to_trial_dir=False),
)
tuner.fit()

# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-fault-tolerance.md
# code:    doc_code/fault_tolerance.py @ d24d6b7bf981 (train.report / train.RunConfig / ray.train._checkpoint form)
# markers: __ft_trial_failure_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (the trainable of __ft_initial_run_start__ (without its run)) ---
import pickle
from tempfile import TemporaryDirectory
from ray import tune
from ray.tune import Checkpoint


def trainable(config):
    # Checkpoint loading
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as tmpdir:
            with open(f"{tmpdir}/ckpt.pkl", "rb") as fin:
                state_dict = pickle.load(fin)
        start = state_dict["epoch"] + 1
    else:
        start = 1

    for epoch in range(start, config["num_epochs"]):
        # Do some training...

        # Checkpoint saving
        with TemporaryDirectory() as tmpdir:
            with open(f"{tmpdir}/ckpt.pkl", "wb") as fout:
                pickle.dump({"epoch": epoch}, fout)

            tune.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(tmpdir))



# --- snippet (as the guide shows it) ---
from ray import tune

tuner = tune.Tuner(
    trainable,
    param_space={"num_epochs": 10},
    run_config=tune.RunConfig(
        storage_path="~/ray_results",
        name="trial_fault_tolerance",
        failure_config=tune.FailureConfig(max_failures=3),
    ),
)
tuner.fit()

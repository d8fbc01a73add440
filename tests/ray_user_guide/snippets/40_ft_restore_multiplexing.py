# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-fault-tolerance.md
# code:    doc_code/fault_tolerance.py @ d24d6b7bf981 (train.report / train.RunConfig / ray.train._checkpoint form)
# markers: __ft_restore_multiplexing_start__ .. _end__
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
import os
from ray import tune

storage_path = "~/ray_results"
exp_name = "tune_fault_tolerance_guide"
path = os.path.join(storage_path, exp_name)

if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
else:
    tuner = tune.Tuner(
        trainable,
        param_space={"num_epochs": 10},
        run_config=tune.RunConfig(storage_path=storage_path, name=exp_name),
    )
tuner.fit()

# --- epilogue: not shown in the guide (fault_tolerance.py: the same logic again must take the restore branch; Tuner.get_results() (issue 44 item 4)) ---
if tune.Tuner.can_restore(path):
    tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
else:
    tuner = tune.Tuner(
        trainable,
        param_space={"num_epochs": 10},
        run_config=tune.RunConfig(storage_path=storage_path, name=exp_name),
    )
assert tuner.get_results()

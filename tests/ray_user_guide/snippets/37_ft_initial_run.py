# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-fault-tolerance.md
# code:    doc_code/fault_tolerance.py @ d24d6b7bf981 (train.report / train.RunConfig / ray.train._checkpoint form)
# markers: __ft_initial_run_start__ .. _end__
# kind:    literalinclude

# --- snippet (as the guide shows it) ---
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


tuner = tune.Tuner(
    trainable,
    param_space={"num_epochs": 10},
    run_config=tune.RunConfig(
        storage_path="~/ray_results", name="tune_fault_tolerance_guide"
    ),
)
tuner.fit()

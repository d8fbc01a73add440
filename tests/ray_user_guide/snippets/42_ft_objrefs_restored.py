# MODERNIZED by modernize.sh (train.* -> tune.*), not Ray's text; see README
# Ray Tune user guide snippet (catalogued for popflow's corpus; imports NOT yet rewritten)
# guide:   ray-project/ray doc/source/tune/tutorials/tune-fault-tolerance.md
# code:    doc_code/fault_tolerance.py @ d24d6b7bf981 (train.report / train.RunConfig / ray.train._checkpoint form)
# markers: __ft_restore_objrefs_restored_start__ .. _end__
# kind:    literalinclude

# --- prelude: not shown in the guide (__ft_restore_objrefs_initial_start__ block, then fault_tolerance.py's ray.shutdown()) ---
import ray
from ray import tune


class LargeModel:
    def __init__(self, model_id):
        self.model_id = model_id
        # Load weights based on the `model_id`...


def train_fn(config):
    # Retrieve the model from the object store.
    model = ray.get(config["model_ref"])
    print(model.model_id)


# These models may be large, so `ray.put` them in the Ray Object Store
# to share the models between trials.
model_refs = [ray.put(LargeModel(1)), ray.put(LargeModel(2))]

tuner = tune.Tuner(
    train_fn,
    # Tune over the object references!
    param_space={"model_ref": tune.grid_search(model_refs)},
    run_config=tune.RunConfig(
        storage_path="~/ray_results", name="restore_object_refs"
    ),
)
tuner.fit()

if ray.is_initialized():
    ray.shutdown()

# --- snippet (as the guide shows it) ---
# Re-create the objects and put them in the object store.
param_space = {
    "model_ref": tune.grid_search([ray.put(LargeModel(1)), ray.put(LargeModel(2))])
}

tuner = tune.Tuner.restore(
    "~/ray_results/restore_object_refs",
    trainable=train_fn,
    # Re-specify the `param_space` to update the object references.
    param_space=param_space,
    resume_errored=True,
)
tuner.fit()

"""``ray.put`` / ``ray.get`` in a ``param_space`` (issue 44, item 9): refs that resolve on
the workers, committed by name only, and given anew to a resumed run as Ray's
fault-tolerance guide does (``Tuner.restore(..., param_space={...new refs...})``)."""

from __future__ import annotations

import copy
import json
import os
import pickle
from typing import Any

import numpy as np
import pytest

import popflow
from popflow import tune
from popflow.flows.spec.args_codec import Decoder, Encoder
from popflow.infra.store.layout import PICKLED_ARGS_FILE, RUN_ARGS_FILE
from popflow.schedulers.variants import resolve_variants
from popflow.tasks import report
from popflow.tasks.object_refs import ObjectRef, ObjectRefMissing, as_object_refs
from popflow.tune import Tuner

#: The bytes every model carries: large enough that a pickled model would show.
PAYLOAD = 2_000_000


class LargeModel:
    """The guide's model, with weights and the generation of the process that made it."""

    def __init__(self, model_id: int, generation: int) -> None:
        self.model_id = model_id
        self.generation = generation
        self.weights = np.frombuffer(os.urandom(PAYLOAD), dtype=np.uint8)


def train_fn(config: dict[str, Any]) -> None:
    """The guide's ``train_fn``; model 2 of the first generation fails (an error a
    restore with ``resume_errored=True`` goes on from)."""
    model = popflow.get(config["model_ref"])
    if model.model_id == 2 and model.generation == 1:
        raise RuntimeError("model 2 fails in the first run")
    report({"model_id": model.model_id, "generation": model.generation})


@pytest.fixture(autouse=True)
def _nothing_held():
    """Each test starts and ends as a fresh process would: no values put, no init."""
    popflow.shutdown()
    yield
    popflow.shutdown()


# -- the ref itself ------------------------------------------------------------------------


@pytest.mark.unit
def test_get_returns_a_fresh_copy_of_what_was_put_and_takes_a_list():
    value = {"weights": [1, 2, 3]}
    ref = popflow.put(value)
    value["weights"].append(4)  # put pickled it: later changes are not seen (as Ray)
    got = popflow.get(ref)
    assert got == {"weights": [1, 2, 3]}
    got["weights"].clear()  # one trial training its copy changes no other's
    assert popflow.get(ref) == {"weights": [1, 2, 3]}
    other = popflow.put(7)
    assert popflow.get([ref, other]) == [{"weights": [1, 2, 3]}, 7]
    assert popflow.is_initialized()  # Ray's put starts Ray


@pytest.mark.unit
def test_get_of_a_plain_value_or_put_of_a_ref_is_an_error_as_in_ray():
    ref = popflow.put(1)
    with pytest.raises(ValueError, match="must either be an ObjectRef or a list"):
        popflow.get(1)
    with pytest.raises(ValueError, match="must either be an ObjectRef"):
        popflow.get(str(ref))  # its name, not a ref
    with pytest.raises(TypeError, match="not an ObjectRef"):
        popflow.get([ref, 2])
    with pytest.raises(TypeError, match="'put' on an ObjectRef"):
        popflow.put(ref)


@pytest.mark.unit
def test_a_ref_pickles_copies_and_hashes_by_its_name_never_its_value():
    ref = popflow.put(np.zeros(1_000_000))
    assert len(pickle.dumps(ref)) < 200
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert copy.deepcopy(ref) is ref and {ref: 1}[ObjectRef(str(ref))] == 1
    assert repr(ref) == f"ObjectRef({ref.hex()})" and len(ref.hex()) == 32
    assert json.dumps({"m": ref}) == json.dumps({"m": str(ref)})  # committed: the name


@pytest.mark.unit
def test_shutdown_drops_what_was_put_and_what_init_chose():
    popflow.init(num_cpus=1)
    ref = popflow.put("x")
    assert popflow.is_initialized()
    popflow.shutdown()
    assert not popflow.is_initialized()
    with pytest.raises(ObjectRefMissing, match=ref.hex()):
        popflow.get(ref)


@pytest.mark.unit
def test_grid_search_over_refs_gives_each_trial_one_ref():
    refs = [popflow.put(i) for i in range(3)]
    space = {"model_ref": tune.grid_search(refs), "lr": 0.1}
    variants = resolve_variants(space, 1, np.random.default_rng(0))
    assert [v.config["model_ref"] for v in variants] == refs
    assert all(type(v.config["model_ref"]) is ObjectRef for v in variants)


@pytest.mark.unit
def test_run_args_keep_a_ref_by_name_and_a_committed_config_reads_back_as_refs():
    ref = popflow.put(b"x" * 100_000)
    encoder = Encoder()
    encoded = encoder.encode({"m": tune.grid_search([ref])}, "param_space")
    assert not encoder.leaves  # nothing pickled: not the value, not even the ref
    assert encoded == {"m": {"grid_search": [{"$popflow": "object_ref", "name": str(ref)}]}}
    decoded = Decoder(lambda: []).decode(json.loads(json.dumps(encoded)), "param_space")
    assert decoded == {"m": {"grid_search": [ref]}}
    assert type(decoded["m"]["grid_search"][0]) is ObjectRef
    committed = json.loads(json.dumps({"m": ref, "n": [ref], "s": "popflow"}))
    back = as_object_refs(committed)
    assert back == {"m": ref, "n": [ref], "s": "popflow"} and type(back["n"][0]) is ObjectRef


# -- the guide's snippets on a Dask cluster of process workers ------------------------------


def _tuner(refs: list[ObjectRef], storage: str) -> Tuner:
    return tune.Tuner(
        train_fn,
        param_space={"model_ref": tune.grid_search(refs)},
        run_config=tune.RunConfig(storage_path=storage, name="restore_object_refs", verbose=0),
    )


def _folder_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(root, name))
        for root, _dirs, names in os.walk(path)
        for name in names
    )


@pytest.mark.integration
def test_the_guides_refs_run_and_a_restore_with_new_refs_resolves_them(
    prefect_server, dask_cluster, tmp_path
):
    storage = str(tmp_path / "results")
    popflow.init(dask_cluster)
    first = [popflow.put(LargeModel(1, 1)), popflow.put(LargeModel(2, 1))]
    grid = _tuner(first, storage).fit()
    # the committed configs name the refs (their models ran on the workers)
    by_ref = {r.config["model_ref"]: (r.metrics.get("model_id"), r.error is not None) for r in grid}
    assert by_ref == {first[0]: (1, False), first[1]: (None, True)}
    path = grid.experiment_path
    # so do the kept arguments; no model is in storage
    assert _folder_bytes(path) < PAYLOAD / 4
    with open(os.path.join(path, RUN_ARGS_FILE)) as kept:
        assert '"object_ref"' in kept.read()
    assert not os.path.exists(os.path.join(path, PICKLED_ARGS_FILE))

    popflow.shutdown()  # the guide's `ray.shutdown()`: a new session, its own refs
    popflow.init(dask_cluster)
    param_space = {
        "model_ref": tune.grid_search(
            [popflow.put(LargeModel(1, 2)), popflow.put(LargeModel(2, 2))]
        )
    }
    tuner = Tuner.restore(path, train_fn, param_space=param_space, resume_errored=True)
    again = tuner.fit()
    by_model = {r.metrics["model_id"]: r.metrics["generation"] for r in again}
    assert by_model == {1: 1, 2: 2}  # model 2 ran again, with the new process's model
    assert all(r.error is None for r in again)
    assert _folder_bytes(path) < PAYLOAD / 4


@pytest.mark.integration
def test_a_restore_without_new_refs_names_the_missing_object(
    prefect_server, dask_cluster, tmp_path
):
    storage = str(tmp_path / "results")
    popflow.init(dask_cluster)
    first = [popflow.put(LargeModel(1, 1)), popflow.put(LargeModel(2, 1))]
    path = _tuner(first, storage).fit().experiment_path
    popflow.shutdown()
    popflow.init(dask_cluster)
    tuner = Tuner.restore(path, train_fn, resume_errored=True)  # no param_space: old refs
    with pytest.raises(ObjectRefMissing) as raised:
        tuner.fit()
    text = str(raised.value)
    assert repr(first[1]) in text and repr(first[0]) not in text  # model 1's trial finished
    assert "param_space['model_ref']['grid_search'][1]" in text
    assert "Tuner.restore(path, trainable, param_space=" in text

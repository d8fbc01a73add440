"""A run's arguments are kept as data where they can be, and storage holds as little code as
it must: what JSON cannot say is pickled and said so, a with_parameters file is unpickled
only if it matches its SHA-256 name, a dict checkpoint only if it matches its manifest,
and what cannot be read back is one line from ``popflow resume``."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import re

import cloudpickle
import pytest
from trainables import ParityTrainable, with_data

from popflow import (
    Checkpoint,
    CheckpointConfig,
    choice,
    grid_search,
    loguniform,
    run,
    sample_from,
    uniform,
)
from popflow.flows.api.cli import main
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.flows.spec.args_codec import constructor_arguments
from popflow.flows.spec.run_args import BadRunArgs, load_run_args, save_run_args
from popflow.infra.jsonutil import jsonable
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import CheckpointError
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import (
    OLD_RUN_ARGS_FILE,
    PARAMETERS_DIR,
    PICKLED_ARGS_FILE,
    RUN_ARGS_FILE,
)
from popflow.schedulers import PopulationBasedTraining, Trial
from popflow.tasks.parameters import ParametersMismatch, with_parameters, with_stored_parameters


class Plant:
    """Unpickling it creates ``path``: what a crafted pickle in storage would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def as_data_args() -> dict:
    return {
        "trainable": ParityTrainable,
        "param_space": {
            "a": grid_search([1, 2]),
            "lr": loguniform(1e-4, 1e-1),
            "net": {"layers": choice([(1, 2), (3, 4)]), "width": 3},
        },
        "scheduler": PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"lr": uniform(0, 1), "c": [1, 2]},
            metric="mean_accuracy",
            mode="max",
        ),
        "num_samples": 2,
        "stop": {"training_iteration": 4},
        "checkpoint_config": CheckpointConfig(checkpoint_frequency=2, num_to_keep=1),
        "seed": 7,
        "callbacks": None,
    }


@pytest.mark.unit
def test_arguments_that_json_can_say_are_kept_as_json_only(tmp_path, caplog):
    storage = Storage(str(tmp_path))
    args = as_data_args()
    with caplog.at_level(logging.INFO, logger="popflow.flows.spec.run_args"):
        save_run_args(storage, args)
    assert not caplog.records  # nothing pickled, nothing to say
    assert storage.listdir(".popflow") == ["run_args.json"]
    record = json.loads(storage.read_text(RUN_ARGS_FILE))
    assert record["args"]["trainable"] == {
        "$popflow": "import",
        "path": "trainables:ParityTrainable",
    }
    back = load_run_args(storage)
    assert back["trainable"] is ParityTrainable
    assert back["param_space"] == args["param_space"]
    assert back["checkpoint_config"] == args["checkpoint_config"]
    assert type(back["scheduler"]) is PopulationBasedTraining
    assert constructor_arguments(back["scheduler"]) == constructor_arguments(args["scheduler"])
    assert {k: v for k, v in back.items() if k not in ("param_space", "scheduler")} == {
        k: v for k, v in args.items() if k not in ("param_space", "scheduler")
    }


@pytest.mark.unit
def test_what_json_cannot_say_is_pickled_and_said(tmp_path, caplog):
    storage = Storage(str(tmp_path))
    args = as_data_args()
    args["param_space"]["b"] = sample_from(lambda spec: spec["a"] * 2)
    args["scheduler"] = PopulationBasedTraining(hyperparam_mutations={"c": lambda: 3})
    with caplog.at_level(logging.INFO, logger="popflow.flows.spec.run_args"):
        save_run_args(storage, args)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "param_space['b'].func, scheduler.hyperparam_mutations['c'] kept as a pickle" in said
    assert "whoever can write this storage can run code" in said
    assert storage.file_exists(PICKLED_ARGS_FILE)
    back = load_run_args(storage)
    assert back["param_space"]["b"].sample(None, {"a": 4}) == 8
    assert back["scheduler"]._hyperparam_mutations["c"]() == 3


@pytest.mark.integration
def test_on_an_object_store_what_is_pickled_is_a_warning(s3_server, s3_url, caplog):
    _, options = s3_server
    storage = Storage(f"{s3_url}/exp", options)
    args = {**as_data_args(), "stop": lambda trial_id, result: False}
    with caplog.at_level(logging.INFO, logger="popflow.flows.spec.run_args"):
        save_run_args(storage, args)
    (said,) = caplog.records
    assert said.levelno == logging.WARNING and "stop kept as a pickle" in said.getMessage()
    assert load_run_args(storage)["stop"]("t", {}) is False


@pytest.mark.unit
def test_a_pickle_is_unpickled_only_if_it_is_the_one_the_json_records(tmp_path):
    storage = Storage(str(tmp_path))
    args = as_data_args()
    args["stop"] = lambda trial_id, result: False
    save_run_args(storage, args)
    planted = tmp_path / "planted"
    storage.write_bytes(pickle.dumps([Plant(str(planted))]), PICKLED_ARGS_FILE)
    with pytest.raises(BadRunArgs, match="its SHA-256 is not the one"):
        load_run_args(storage)
    assert not planted.exists()
    # the file: an experiment written now has none, and one planted is never read
    storage.remove_file(PICKLED_ARGS_FILE)
    save_run_args(storage, as_data_args())
    storage.write_bytes(pickle.dumps(Plant(str(planted))), OLD_RUN_ARGS_FILE)
    assert load_run_args(storage)["trainable"] is ParityTrainable
    assert not planted.exists()


@pytest.mark.unit
def test_experiments_of_the_old_format_still_resume(tmp_path):
    storage = Storage(str(tmp_path))
    args = as_data_args()
    storage.write_bytes(cloudpickle.dumps(args), OLD_RUN_ARGS_FILE)
    back = load_run_args(storage)
    assert back["trainable"] is ParityTrainable and back["param_space"] == args["param_space"]


def forged_experiment(tmp_path) -> Storage:
    """A committed experiment (one trial, nothing run) to resume from the command line."""
    storage = Storage(str(tmp_path / "exp"))
    record = TrialRecord(Trial("t_00000", {"a": 1}), index=0, dirname="T_t_00000")
    trial = jsonable(record.state())
    ExperimentLog(storage).commit(
        {"round": 1, "trials": [trial], "scheduler": {}, "derived": {}}, True
    )
    return storage


def record_of(args: dict) -> bytes:
    return json.dumps({"format": 1, "args": args}).encode()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "data", "message"),
    [
        (RUN_ARGS_FILE, b"{not json", "not JSON"),
        (RUN_ARGS_FILE, b"[1, 2]", "not popflow's format 1"),
        (RUN_ARGS_FILE, record_of({"num_samples": 2}), "no trainable"),
        (
            RUN_ARGS_FILE,
            record_of({"trainable": {"$popflow": "import", "path": "subprocess:call"}}),
            r"a function of \(\*popenargs",
        ),
        (
            RUN_ARGS_FILE,
            record_of(
                {
                    "trainable": {"$popflow": "import", "path": "trainables:ParityTrainable"},
                    "bogus": 1,
                }
            ),
            r"run\(\) does not take: \['bogus'\]",
        ),
        (RUN_ARGS_FILE, record_of({"trainable": {"$popflow": "rocket"}}), "unknown kind"),
        (
            RUN_ARGS_FILE,
            record_of({"trainable": {"$popflow": "pickled", "index": 0}}),
            "run_args.pkl cannot be read back as the run's arguments: it is missing",
        ),
        (OLD_RUN_ARGS_FILE, b"\x80\x05garbage", "it does not unpickle"),
        (OLD_RUN_ARGS_FILE, pickle.dumps([1, 2]), "it holds a list"),
        (OLD_RUN_ARGS_FILE, pickle.dumps({"trainable": 3}), "`trainable` is int"),
    ],
)
def test_run_arguments_that_cannot_be_read_back_are_one_line_and_exit_2(
    tmp_path, capsys, name, data, message
):
    storage = forged_experiment(tmp_path)
    storage.write_bytes(data, name)
    with pytest.raises(SystemExit) as exit_info:
        main(["resume", storage.url])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"popflow: {storage.full_url('.popflow')}/"), err
    assert "cannot be read back as the run's arguments" in err[0], err
    assert re.search(message, err[0]), err


@pytest.mark.unit
def test_wrong_values_in_the_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    storage = forged_experiment(tmp_path)
    storage.write_text('{"seed": 7}', ".popflow/experiment.json")  # else resume needs it first
    # no scheduler: resume would first try the commit's scheduler state on it
    save_run_args(storage, {**as_data_args(), "num_samples": "many", "scheduler": None})
    with pytest.raises(SystemExit) as exit_info:
        main(["resume", storage.url])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "popflow: `num_samples` is 'many', but must be an int >= 1 (--verbose shows where)"
    ]


@pytest.mark.unit
def test_with_parameters_files_are_checked_against_their_sha256_name(tmp_path):
    storage = Storage(str(tmp_path))
    trainable = with_parameters(with_data, data=[1, 2, 3])
    params = trainable._popflow_parameters
    params.store(storage)
    (path,) = params.paths.values()
    args = {"trainable": trainable, "param_space": {"x": 1}}
    save_run_args(storage, args)
    assert not storage.file_exists(PICKLED_ARGS_FILE)  # the wrapped function and the paths
    again = load_run_args(storage)["trainable"]
    loaded = again._popflow_parameters
    loaded.attach(storage)
    assert loaded.load() == {"data": [1, 2, 3]}

    planted = tmp_path / "planted"
    other = Storage(str(tmp_path / "other"))  # an experiment whose file was swapped
    other.write_bytes(pickle.dumps(Plant(str(planted))), path)  # the same name, other bytes
    swapped = with_stored_parameters(with_data, {"data": path})._popflow_parameters
    swapped.attach(other)
    with pytest.raises(ParametersMismatch, match=f"{path}.*does not match the SHA-256"):
        swapped.load()
    assert not planted.exists()
    digest = hashlib.sha256(b"x").hexdigest()[:32]
    for bad in ("../../elsewhere.pkl", f"{PARAMETERS_DIR}/../{digest}.pkl", "x.pkl"):
        with pytest.raises(ParametersMismatch, match="not a file popflow stores objects in"):
            with_stored_parameters(with_data, {"data": bad})


@pytest.mark.integration
def test_a_dict_checkpoint_is_unpickled_only_if_it_matches_its_manifest(tune_env, tmp_path):
    grid = run(
        ParityTrainable,
        {"a": 1},
        stop={"training_iteration": 1},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        name="dict",
        **tune_env,
    )
    checkpoint = grid[0].checkpoint
    assert checkpoint.to_dict() == {"a": 1}
    planted = tmp_path / "planted"
    with open(os.path.join(checkpoint.path, "_dict_checkpoint.pkl"), "wb") as f:
        pickle.dump(Plant(str(planted)), f)
    for read in (checkpoint.to_dict, lambda: Checkpoint(checkpoint.path).load_into(None)):
        with pytest.raises(CheckpointError, match="fails its check"):
            read()
    assert not planted.exists()

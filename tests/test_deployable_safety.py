"""The deployable ``experiment`` flow runs only trainables its owner allows, and a mistake in
its parameters fails the flow run at once, without the retries real failures get."""

from __future__ import annotations

import asyncio
import os
import pickle
import re
import sys
import textwrap
import time

import pytest

from popflow.flows.record import deployable
from popflow.flows.spec import storage_roots
from popflow.flows.spec.trainable_paths import (
    ALLOWLIST_ENV,
    DEFAULT_ALLOWLIST,
    allowlist,
    check_trainable,
    is_allowed,
    load_trainable,
)
from popflow.tasks.parameters import with_parameters

MOCK = "popflow.tune.utils.mock_trainable:MyTrainableClass"


@pytest.mark.system
def test_the_issues_shell_command_is_refused_and_runs_nothing(tune_env, tmp_path, monkeypatch):
    """trainable="subprocess:call" with a param_space of {"touch": 1, <path>: 2} ran
    `touch <path>` on a worker."""
    touched = tmp_path / "touched-by-the-flow"
    params = dict(
        trainable="subprocess:call",
        param_space={"touch": 1, str(touched): 2},
        storage=tune_env["storage"],
        name="shell",
        dask_address=tune_env["dask_address"].scheduler.address,
        plots=False,
    )
    monkeypatch.delenv(ALLOWLIST_ENV, raising=False)
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, tune_env["storage"])
    with pytest.raises(ValueError, match="'subprocess:call' is not among the trainables"):
        deployable.experiment(**params)
    # an owner who allows every path still gets no shell command: it is no trainable
    monkeypatch.setenv(ALLOWLIST_ENV, "*")
    with pytest.raises(ValueError, match=r"a function of \(\*popenargs.*refusing to run it"):
        deployable.experiment(**params)
    assert not touched.exists()
    assert not (tmp_path / "results" / "shell").exists()  # nothing was started


@pytest.mark.unit
def test_a_path_outside_the_allowlist_is_not_even_imported(tmp_path, monkeypatch):
    (tmp_path / "loud_module.py").write_text(
        textwrap.dedent(f"""
            open({str(tmp_path / "imported")!r}, "w").close()

            def train(config):
                pass
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(ALLOWLIST_ENV, "mypkg, other.pkg:Trainer")
    assert allowlist() == ("mypkg", "other.pkg:Trainer")
    with pytest.raises(ValueError, match=f"not among .*mypkg, other.pkg:Trainer.*{ALLOWLIST_ENV}"):
        deployable.load_trainable("loud_module:train")
    assert not (tmp_path / "imported").exists() and "loud_module" not in sys.modules
    monkeypatch.setenv(ALLOWLIST_ENV, "loud_module")
    assert deployable.load_trainable("loud_module:train").__name__ == "train"
    assert (tmp_path / "imported").exists()


@pytest.mark.unit
def test_the_default_allowlist_is_popflows_demo_trainable(monkeypatch):
    monkeypatch.delenv(ALLOWLIST_ENV, raising=False)
    assert allowlist() == DEFAULT_ALLOWLIST
    assert deployable.load_trainable(MOCK).__name__ == "MyTrainableClass"
    with pytest.raises(ValueError, match="not among the trainables"):
        deployable.load_trainable("popflow.tasks.trainable:Trainable")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("path", "prefixes", "allowed"),
    [
        ("mypkg.train:T", ["mypkg"], True),
        ("mypkg:T", ["mypkg"], True),
        ("mypkg.train:T", ["mypkg."], True),
        ("mypkg_evil.train:T", ["mypkg"], False),
        ("mypkg.train:T", ["mypkg.train:T"], True),
        ("mypkg.train:U", ["mypkg.train:T"], False),
        ("mypkg.train:U", ["mypkg.train:"], True),
        ("mypkg.trainer:U", ["mypkg.train:"], False),
        ("mypkg.train:T", ["other", "mypkg.train"], True),
        ("subprocess:call", ["*"], True),
        ("subprocess:call", [], False),
    ],
)
def test_allowlist_prefixes_match_whole_names(path, prefixes, allowed):
    assert is_allowed(path, prefixes) is allowed


@pytest.mark.unit
def test_storage_outside_the_allowlist_is_refused_before_anything_is_read(tmp_path, monkeypatch):
    """Break 6: a caller pointed a run at a folder they could write, with checkpoints they
    planted there. Only the owner's storage roots are taken; the rest is refused before
    anything is read or written, naming the parameter, its value and the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(storage_roots.ALLOWLIST_ENV, raising=False)
    assert storage_roots.allowlist() == storage_roots.DEFAULT_ALLOWLIST == ("./results",)
    planted = tmp_path / "caller-writes-here"
    for storage in (str(planted), f"file://{planted}", "s3://bucket/exp", "./results/../x"):
        with pytest.raises(
            ValueError,
            match=rf"`storage` '{re.escape(storage)}' is not among the storage roots this "
            rf"deployment may use \(\./results\); its owner allows more with "
            rf"{storage_roots.ALLOWLIST_ENV}",
        ):
            deployable.experiment.fn(trainable=MOCK, storage=storage, name="x", plots=False)
    assert sorted(os.listdir(tmp_path)) == []  # nothing made, nothing read
    storage_roots.check_storage("./results")
    storage_roots.check_storage(str(tmp_path / "results" / "team-a"))
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, f" s3://bucket/exp , {planted}")
    assert storage_roots.allowlist() == ("s3://bucket/exp", str(planted))
    storage_roots.check_storage("s3://bucket/exp/sub")
    storage_roots.check_storage(str(planted))
    with pytest.raises(ValueError, match="not among the storage roots"):
        storage_roots.check_storage("./results")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("storage", "roots", "allowed"),
    [
        ("s3://b/exp", ["s3://b/exp"], True),
        ("s3://b/exp/", ["s3://b/exp"], True),
        ("s3://b/exp/a/b", ["s3://b/exp/"], True),
        ("s3://b/exp2", ["s3://b/exp"], False),
        ("s3://b/exp/../other", ["s3://b/exp"], False),
        ("s3://b/exp/./x", ["s3://b/exp"], False),
        ("gcs://b/exp", ["s3://b/exp"], False),
        ("S3://b/exp/x", ["s3://b/exp"], True),
        ("/data/exp", ["/data"], True),
        ("/data/../etc", ["/data"], False),
        ("/database", ["/data"], False),
        ("file:///data/x", ["/data"], True),
        ("/anything", ["*"], True),
        ("/data/x", [], False),
        ("simplecache::/tmp/evil", ["."], False),  # fsspec would open /tmp/evil
        ("/data/x::/tmp/evil", ["/data"], False),
        ("s3://b/exp::file:///tmp/evil", ["s3://b/exp"], False),
    ],
)
def test_storage_roots_match_whole_names(storage, roots, allowed):
    assert storage_roots.is_allowed(storage, roots) is allowed


@pytest.mark.unit
def test_a_link_in_an_allowed_root_that_leads_out_is_refused(tmp_path):
    root, outside = tmp_path / "results", tmp_path / "victim"
    root.mkdir()
    outside.mkdir()
    (root / "exp").symlink_to(outside)
    assert not storage_roots.is_allowed(str(root / "exp"), [str(root)])
    assert storage_roots.is_allowed(str(root / "own"), [str(root)])


def _one_config(config):
    return config


def _legacy(config, checkpoint_dir=None):
    return config


def _two(config, reporter):
    return config


def _star(*args):
    return args


@pytest.mark.unit
@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_one_config, None),
        (_legacy, None),
        (with_parameters(_two, reporter=1), None),
        (_two, r"a function of \(config, reporter\)"),
        (_star, r"a function of \(\*args\)"),
        (dict, "the class dict, which does not subclass popflow.Trainable"),
        (print, "builtin_function_or_method"),
        (3, "int 3"),
    ],
)
def test_only_trainables_pass(obj, message):
    if message is None:
        check_trainable(obj, "m:x")
    else:
        with pytest.raises(ValueError, match=message):
            check_trainable(obj, "m:x")


@pytest.mark.unit
def test_a_trainable_outside_its_module_still_loads_without_an_allowlist():
    assert load_trainable(MOCK).__name__ == "MyTrainableClass"


def flow_run_of(state) -> tuple[str, int]:
    """(state type, run count) of the flow run that ended in ``state``, as the API has it."""
    from prefect.client.orchestration import get_client

    async def read():
        async with get_client() as client:
            return await client.read_flow_run(state.state_details.flow_run_id)

    flow_run = asyncio.run(read())
    return flow_run.state.type.value, flow_run.run_count


@pytest.mark.integration
def test_a_mistake_fails_the_flow_run_at_once_without_retries(
    prefect_server, tmp_path, monkeypatch
):
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, str(tmp_path))
    started = time.monotonic()
    state = deployable.experiment(
        trainable=MOCK, scheduler="bohb", storage=str(tmp_path), plots=False, return_state=True
    )
    assert time.monotonic() - started < 8  # the retry delay is 10 s
    assert state.is_failed() and "must be one of" in state.message
    assert flow_run_of(state) == ("FAILED", 1)


@pytest.mark.integration
def test_a_storage_failure_is_still_retried(prefect_server, tmp_path, monkeypatch):
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, str(tmp_path))
    blocked = tmp_path / "a-file"
    blocked.write_text("storage cannot be a folder under a file")
    flow = deployable.experiment.with_options(retry_delay_seconds=0)
    state = flow(trainable=MOCK, storage=str(blocked), plots=False, return_state=True)
    assert state.is_failed()
    assert flow_run_of(state) == ("FAILED", 3)  # the first attempt and its 2 retries


@pytest.mark.integration
def test_a_pickle_planted_in_the_experiment_never_runs_through_the_flow(tune_env, monkeypatch):
    """Break 6 as found: JSON parameters only (an allowed storage the caller can write,
    resume="auto", the demo trainable); a `_dict_checkpoint.pkl` planted beside each
    checkpoint of the first run was unpickled by the next run's restores."""
    from test_unlisted_files import Planted

    storage = tune_env["storage"]
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, storage)
    params = dict(
        trainable=MOCK,
        param_space={"width": {"randint": [2, 20]}, "height": {"uniform": [10, 100]}},
        scheduler="pbt",  # its exploits restore from other trials' checkpoints
        scheduler_args={
            "time_attr": "training_iteration",
            "perturbation_interval": 2,
            "synch": True,
            "hyperparam_mutations": {"height": {"uniform": [10, 100]}},
        },
        metric="episode_reward_mean",
        mode="max",
        num_samples=4,
        stop={"training_iteration": 8},
        storage=storage,
        name="planted",
        seed=0,
        max_rounds=1,
        checkpoint_frequency=2,
        dask_address=tune_env["dask_address"].scheduler.address,
        plots=False,
    )
    out = deployable.experiment(**params)
    marker = os.path.join(os.path.dirname(storage), "code-from-storage-ran")
    planted = 0
    for folder, dirs, _ in os.walk(out["experiment"]):
        for d in dirs:
            if d.startswith("checkpoint_"):
                with open(os.path.join(folder, d, "_dict_checkpoint.pkl"), "wb") as f:
                    pickle.dump(Planted(marker), f)
                planted += 1
    assert planted
    runs = 0
    while not out["finished"]:
        out = deployable.experiment(**params)
        runs += 1
        assert runs < 30
    assert not os.path.exists(marker)

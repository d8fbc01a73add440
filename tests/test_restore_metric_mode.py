"""A restored run's searcher gets the run's metric and mode (issue 44, item 11): the
``TuneConfig``'s are kept in ``run_args.json``, where before only the scheduler carried
them and a searcher was checked again with none ("HEBOSearch has metric=None ...")."""

from __future__ import annotations

import pytest

from popflow import tune
from popflow.flows.spec.groups import ResumeSpec, StorageSpec
from popflow.flows.spec.run_args import load_run_args, save_run_args
from popflow.flows.spec.run_spec import run_spec
from popflow.infra.storage.folder import Storage
from popflow.tune.search.hebo import HEBOSearch
from popflow.tune.search.optuna import OptunaSearch


def _objective(config):
    tune.report({"m": -((config["x"] - 0.3) ** 2)})


def _spec(tmp_path, tune_config, resume=False):
    return run_spec(
        _objective,
        {"x": tune.uniform(0, 1)},
        tune_config,
        tune.RunConfig(name="kept"),
        StorageSpec(Storage(str(tmp_path))),
        resuming=ResumeSpec(resume),
    )


@pytest.mark.unit
def test_run_args_keep_the_runs_metric_and_mode_and_a_resume_takes_them(tmp_path):
    config = tune.TuneConfig(search_alg=OptunaSearch(), metric="m", mode="max", num_samples=2)
    folder = Storage(str(tmp_path / "args"))
    save_run_args(folder, _spec(tmp_path, config).run_args(0))
    saved = load_run_args(folder)
    assert (saved["metric"], saved["mode"]) == ("m", "max")
    again = _spec(
        tmp_path,
        tune.TuneConfig(
            search_alg=saved["search_alg"],
            scheduler=saved["scheduler"],  # already carries "m"/"max"
            metric=saved["metric"],
            mode=saved["mode"],
        ),
        resume=True,
    )
    assert (again.tune_config.metric, again.tune_config.mode) == ("m", "max")


@pytest.mark.unit
def test_run_args_keep_no_metric_when_none_was_given(tmp_path):
    folder = Storage(str(tmp_path / "args"))
    save_run_args(folder, _spec(tmp_path, tune.TuneConfig(num_samples=1)).run_args(0))
    assert not {"metric", "mode"} & set(load_run_args(folder))


@pytest.mark.unit
def test_a_new_run_still_refuses_a_scheduler_with_a_metric_of_its_own(tmp_path):
    """Ray's rule holds for a new run, even with the same metric; only a resume's
    scheduler, which the first run set up, may carry the run's."""
    scheduler = tune.schedulers.FIFOScheduler()
    scheduler.set_search_properties("m", "max")
    with pytest.raises(ValueError, match="one place only"):
        _spec(tmp_path, tune.TuneConfig(scheduler=scheduler, metric="m", mode="max"))
    with pytest.raises(ValueError, match="one place only"):
        _spec(tmp_path, tune.TuneConfig(scheduler=scheduler, metric="n", mode="max"), True)


@pytest.mark.unit
def test_hebo_refuses_a_metric_and_mode_of_different_types():
    with pytest.raises(ValueError, match="metric and mode must be of the same type"):
        HEBOSearch(metric=["a", "b"], mode="max")


@pytest.mark.integration
def test_an_optuna_experiment_with_the_runs_metric_is_restored(initialised, tmp_path):
    first = tune.Tuner(
        _objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(), metric="m", mode="max", num_samples=2, seed=3
        ),
        run_config=tune.RunConfig(name="optuna", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert first.errors == []
    restored = tune.Tuner.restore(first.experiment_path, _objective).fit()
    assert restored.errors == []
    assert sorted(r.config["x"] for r in restored) == sorted(r.config["x"] for r in first)

"""Ray Tune's front door, beyond the config classes: callbacks, trial name and folder
creators, ``time_budget_s``, ``max_concurrent_trials``, resuming errored trials,
``with_parameters``, ``tune.run`` and ``Trainable.restore``."""

from __future__ import annotations

import os
from typing import Any

import cloudpickle
import pytest
from trainables import FlakyTrainable, ParityTrainable, SleepyTrainable, with_data

from popflow import run, tune
from popflow.schedulers import grid_search
from popflow.tune import CheckpointConfig, Tuner, Unsupported


class Recorder(tune.Callback):
    """Every hook call, in order, as (hook, str(trial) or None)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.setup_args: dict[str, Any] = {}
        self.checkpoints: list[Any] = []
        self.results = 0
        self.restored: dict[str, Any] | None = None

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.setup_args = {"num_samples": num_samples, "total": total_num_samples}

    def _add(self, hook: str, trial=None) -> None:
        self.calls.append((hook, str(trial) if trial is not None else None))

    def on_step_begin(self, iteration, trials, **info):
        assert iteration >= 1 and all(isinstance(t.trial_id, str) for t in trials)
        self._add("step_begin")

    def on_step_end(self, iteration, trials, **info):
        self._add("step_end")

    def on_trial_start(self, iteration, trials, trial, **info):
        self._add("start", trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        assert trial.last_result["training_iteration"] == result["training_iteration"]
        result["spoiled"] = True  # a copy: the committed result must not change
        self.results += 1
        self._add("result", trial)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._add("complete", trial)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self._add("recover", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._add("error", trial)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self.checkpoints.append(checkpoint)

    def on_experiment_end(self, trials, **info):
        self._add("end")

    def get_state(self):
        return {"results": self.results}

    def set_state(self, state):
        self.restored = dict(state)
        self.results = state["results"]  # counts on across resumes

    def of(self, hook: str) -> list[str | None]:
        return [t for h, t in self.calls if h == hook]


@pytest.mark.integration
def test_callbacks_hear_every_trial_event_in_order(tune_env, tmp_path):
    marker = str(tmp_path / "failed-once")
    rec = Recorder()
    results = run(
        FlakyTrainable,
        {"fail_at": grid_search([None, 2]), "marker": grid_search([marker, None])},
        stop={"training_iteration": 3},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        max_failures=1,
        metric="score",
        mode="max",
        name="callbacks",
        callbacks=[rec],
        **tune_env,
    )
    names = [f"FlakyTrainable_{r.trial_id}" for r in results]
    ok, flaky, ok2, broken = names  # grid order: fail_at varies fastest
    assert rec.setup_args == {"num_samples": 1, "total": 4}
    assert sorted(rec.of("start")) == sorted(names)  # once each, retries included
    assert sorted(rec.of("recover")) == sorted([flaky, broken])  # each retried once
    assert rec.of("error") == [broken]
    assert sorted(rec.of("complete")) == sorted([ok, flaky, ok2])
    assert rec.calls[-1] == ("end", None) and rec.of("end") == [None]
    for name in names:
        hooks = [h for h, t in rec.calls if t == name]
        assert hooks[0] == "start" and hooks[-1] in ("complete", "error")
    results_by_trial = {name: rec.of("result").count(name) for name in names}
    assert results_by_trial == {n: len(r.history) for n, r in zip(names, results, strict=True)}
    assert not any("spoiled" in h for r in results for h in r.history)
    assert rec.of("step_begin") and len(rec.of("step_begin")) == len(rec.of("step_end"))
    assert rec.checkpoints and all(os.path.isdir(c.path) for c in rec.checkpoints[-3:])


@pytest.mark.integration
def test_logger_callback_maps_rays_log_methods(tune_env):
    seen: list[tuple[str, Any]] = []

    class Log(tune.logger.LoggerCallback):
        def log_trial_start(self, trial):
            seen.append(("start", trial.trial_id))

        def log_trial_result(self, iteration, trial, result):
            seen.append(("result", result["training_iteration"]))

        def log_trial_end(self, trial, failed=False):
            seen.append(("end", failed))

    run(
        FlakyTrainable,
        {"fail_at": grid_search([None, 2])},
        stop={"training_iteration": 2},
        name="logger",
        callbacks=[Log()],
        **tune_env,
    )
    assert sorted(k for k, _ in seen if k == "start") == ["start", "start"]
    assert sorted(v for k, v in seen if k == "end") == [False, True]
    assert ("result", 2) in seen


@pytest.mark.unit
def test_callbacks_are_checked():
    with pytest.raises(TypeError, match=r"does not subclass popflow\.tune\.Callback"):
        run(ParityTrainable, callbacks=[object()])
    with pytest.raises(TypeError, match="must be a list"):
        run(ParityTrainable, callbacks=Recorder())


@pytest.mark.integration
def test_trial_name_and_folder_creators_as_rays(tune_env):
    def creator(trial):
        return f"{trial.trainable_name}_{trial.trial_id}_123"

    rec = Recorder()
    results = run(
        ParityTrainable,
        {"a": grid_search([1, 2])},
        stop={"training_iteration": 1},
        name="named",
        callbacks=[rec],
        trial_name_creator=lambda t: f"t{t.config['a']}",
        trial_dirname_creator=creator,
        **tune_env,
    )
    assert sorted(rec.of("start")) == ["t1", "t2"]  # str(trial) is the created name
    folders = [os.path.basename(r.path) for r in results]
    assert folders == [f"ParityTrainable_{r.trial_id}_123" for r in results]
    assert all(os.path.isfile(os.path.join(r.path, "result.json")) for r in results)


@pytest.mark.integration
def test_a_creator_giving_two_trials_one_folder_fails_before_anything_is_written(tune_env):
    with pytest.raises(ValueError, match="gave two trials the same folder"):
        run(
            ParityTrainable,
            {"a": grid_search([1, 2])},
            name="clash",
            trial_dirname_creator=lambda t: "same",
            **tune_env,
        )
    assert not Tuner.can_restore(os.path.join(tune_env["storage"], "clash"))
    with pytest.raises(ValueError, match="a trial folder is one name"):
        run(ParityTrainable, name="slash", trial_dirname_creator=lambda t: "a/b", **tune_env)


@pytest.mark.integration
def test_run_budget_ends_the_run_resumably_and_resume_goes_on(tune_env):
    """Each run gets the budget; nothing is lost or repeated across the runs, and the
    callbacks' state comes back on each resume."""
    kwargs = dict(
        param_space={"a": grid_search([1, 2]), "sleep": 0.05},
        stop={"training_iteration": 40},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        run_budget_s=0.5,  # popflow's budget of a run (Ray's time_budget_s ends the experiment)
        name="budget",
        **tune_env,
    )
    first = Recorder()
    results = run(SleepyTrainable, callbacks=[first], **kwargs)
    path = results.experiment_path
    assert {r.status for r in results} <= {"PENDING", "PAUSED"}
    assert Tuner.can_restore(path) and first.of("end") == []  # the experiment goes on
    done = sum(len(r.history) for r in results)
    # Ray's way back: Tuner.restore takes the run's own arguments (the budget too)
    results = Tuner.restore(path, SleepyTrainable).fit()
    assert sum(len(r.history) for r in results) > done
    first.results = sum(len(r.history) for r in results)  # what the next resume counts on
    runs, before, later = 2, first, first
    while {r.status for r in results} != {"TERMINATED"}:
        later = Recorder()
        results = run(SleepyTrainable, callbacks=[later], resume="auto", **kwargs)
        runs += 1
        assert later.restored == {"results": before.results}  # as the last run left it
        before = later
        assert runs < 60, "no progress across budgets"
    assert runs > 2
    assert later.of("end") == [None]
    assert later.results == 80  # every result once: a cancelled segment's are not taken
    for r in results:
        assert [h["training_iteration"] for h in r.history] == list(range(1, 41))


@pytest.mark.integration
def test_max_concurrent_trials_keeps_trials_waiting_unstarted(tune_env):
    rec = Recorder()
    run(
        ParityTrainable,
        {"a": grid_search([1, 2, 3, 4])},
        stop={"training_iteration": 3},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),  # one-iteration segments
        max_concurrent_trials=2,
        name="capped",
        callbacks=[rec],
        **tune_env,
    )
    live, most = set(), 0
    for hook, trial in rec.calls:
        if hook == "start":
            live.add(trial)
        elif hook == "complete":
            live.discard(trial)
        most = max(most, len(live))
    assert most == 2 and len(rec.of("complete")) == 4
    with pytest.raises(ValueError, match="`max_concurrent_trials` is -1"):
        run(ParityTrainable, max_concurrent_trials=-1)


@pytest.mark.integration
@pytest.mark.parametrize("how", ["resume_errored", "restart_errored"])
def test_restore_resumes_or_restarts_errored_trials(initialised, tmp_path, how):
    storage = str(tmp_path / "results")
    marker = str(tmp_path / "failed-once")
    first = Tuner(
        FlakyTrainable,
        param_space={"fail_at": grid_search([None, 2]), "marker": marker},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(
            name="errored",
            storage_path=storage,
            stop={"training_iteration": 3},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        ),
    ).fit()
    assert [r.status for r in first] == ["TERMINATED", "ERROR"]
    broken = first[1]
    skipped = Tuner.restore(first.experiment_path, FlakyTrainable).fit()
    assert [r.status for r in skipped] == ["TERMINATED", "ERROR"]  # Ray's default: left as is
    again = Tuner.restore(first.experiment_path, FlakyTrainable, **{how: True}).fit()
    assert [r.status for r in again] == ["TERMINATED", "TERMINATED"]
    fixed = again[1]
    assert [h["training_iteration"] for h in fixed.history] == [1, 2, 3]
    if how == "resume_errored":  # from its checkpoint at iteration 1: the same trial
        assert fixed.trial_id == broken.trial_id and fixed.path == broken.path
    else:  # from scratch: a new trial in a new folder; the old folder stays
        assert fixed.trial_id == f"{broken.trial_id}_r1" and fixed.path != broken.path
        assert os.path.isfile(os.path.join(broken.path, "error.txt"))
    assert fixed.metrics["score"] == 3.0


@pytest.mark.integration
def test_with_parameters_stores_each_object_once(tune_env):
    data = list(range(300_000))  # ~1.5 MB pickled
    trainable = tune.with_parameters(with_data, data=data, scale=2.0)
    assert trainable.__name__ == "with_data"
    with pytest.raises(RuntimeError, match="pickled before its objects were stored"):
        cloudpickle.dumps(trainable)
    results = run(
        trainable,
        {"x": grid_search([1.0, 0.5])},
        metric="score",
        mode="max",
        name="params",
        **tune_env,
    )
    total = float(sum(data)) * 2.0
    assert [r.metrics["score"] for r in results] == [total, total * 0.5]
    stored = os.path.join(results.experiment_path, ".popflow", "parameters")
    assert len(os.listdir(stored)) == 2  # data and scale, once each
    assert len(cloudpickle.dumps(trainable)) < 10_000  # segments carry paths, not the data


@pytest.mark.integration
def test_with_parameters_for_a_class_trainable(tune_env):
    class Scaled(ParityTrainable):
        def setup(self, config, offset=0):
            super().setup(config)
            self.a += offset

    results = run(
        tune.with_parameters(Scaled, offset=100),
        {"a": 1},
        stop={"training_iteration": 2},
        name="class-params",
        **tune_env,
    )
    assert results[0].metrics["mean_accuracy"] == 2 + 101
    assert os.path.basename(results[0].path).startswith("Scaled_")


@pytest.mark.integration
def test_tune_run_takes_rays_keywords(initialised, tmp_path):
    analysis = tune.run(
        ParityTrainable,
        config={"a": grid_search([1, 5])},
        stop={"training_iteration": 2},
        metric="mean_accuracy",
        mode="max",
        storage_path=str(tmp_path),
        name="legacy",
        verbose=0,
    )
    assert analysis.best_config == {"a": 5}
    assert analysis.best_result["mean_accuracy"] == 7
    assert analysis.get_best_config("mean_accuracy", "min") == {"a": 1}
    assert list(analysis.results_df["config/a"]) == [1, 5]
    with pytest.warns(DeprecationWarning, match="checkpoint_frequency"):
        kept = tune.run(
            ParityTrainable,
            config={"a": 1},
            stop={"training_iteration": 3},
            storage_path=str(tmp_path),
            name="legacy-ckpt",
            checkpoint_freq=1,
            keep_checkpoints_num=2,
        )
    assert len(kept[0].best_checkpoints) == 2
    again = tune.run(ParityTrainable, config={"a": 1}, storage_path=str(tmp_path),
                     name="legacy-ckpt", resume="AUTO")  # fmt: skip
    assert again[0].metrics == kept[0].metrics  # finished: its results back


@pytest.mark.integration
def test_tune_run_raises_on_failed_trials_as_ray(initialised, tmp_path):
    kwargs = dict(config={"fail_at": 1}, stop={"training_iteration": 2}, storage_path=str(tmp_path))
    with pytest.raises(tune.TuneError, match="Trials did not complete"):
        tune.run(FlakyTrainable, name="fails", **kwargs)
    grid = tune.run(FlakyTrainable, name="fails-quietly", raise_on_failed_trial=False, **kwargs)
    assert grid.num_errors == 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"export_formats": ["h5"]}, "export_formats"),
        ({"resume": "LOCAL"}, "resume"),
        ({"progress_reporter": object()}, "progress_reporter"),
    ],
)
def test_tune_run_refuses_what_it_cannot_honour_by_name(kwargs, argument):
    with pytest.raises(Unsupported, match=f"`{argument}="):
        tune.run(ParityTrainable, **kwargs)


@pytest.mark.integration
def test_a_trainable_restores_from_a_result_checkpoint_in_one_call(tune_env):
    results = run(
        ParityTrainable,
        {"a": 7},
        stop={"training_iteration": 4},
        name="restorable",
        **tune_env,
    )
    best = results[0]
    model = ParityTrainable(best.config)
    model.restore(best.checkpoint)
    assert (model.a, model.iteration) == (7, 4)
    assert model.step()["mean_accuracy"] == 5 + 7
    again = ParityTrainable({"a": 0})
    again.restore(best.checkpoint.path)  # a path works too
    assert again.a == 7

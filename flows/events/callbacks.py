"""Ray Tune's callbacks: ``tune.Callback`` and ``tune.logger.LoggerCallback``, called on the driver.

Pass them as ``RunConfig(callbacks=[...])`` (or ``run(callbacks=...)``). The
hooks and their arguments are Ray's: ``iteration`` is the round, ``trials``
every trial of the experiment (:class:`popflow.schedulers.Trial`: ``trial_id``,
``config``, ``status``, ``last_result``, ``str(trial)`` its name, ``path`` its folder
in storage, ``local_path`` a folder on the driver beside it), ``trial`` the one
concerned. What a callback writes in ``trial.local_path`` reaches the trial's folder
(on remote storage: copied each round and when the trial ends,
:mod:`popflow.flows.events.staging`). A hook that raises stops the run, as in Ray; what was
committed before stays, so the experiment can be resumed.

A callback's ``get_state()`` (JSON-able) is committed every round and given
back to ``set_state()`` when the experiment resumes. Not called (yet):
``on_trial_restore``.

As in Ray, ``on_trial_result`` may set ``result[SHOULD_CHECKPOINT] = True``
(:mod:`popflow.tune.result`): the trial saves a checkpoint of that result's state
before its next step. A run with such a callback (one that overrides
``on_trial_result`` and is not a ``LoggerCallback``) lets each trial run one
iteration at a time where no scheduler milestone bounds its segments, so the
callback sees every result before the next step, as Ray's does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from popflow.flows.events.staging import Staging
from popflow.infra.storage.folder import Storage
from popflow.schedulers import Trial
from popflow.tasks.result_keys import SHOULD_CHECKPOINT


class Callback:
    """Ray's ``tune.Callback``: subclass it and override the hooks you need."""

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """Once, before the first round (and again when a run resumes)."""

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """At the start of every round."""

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        """At the end of every round, before its commit."""

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """When ``trial`` first runs in this driver (again after a resume)."""

    def on_trial_restore(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """Ray's hook; popflow does not call it yet."""

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        """When ``trial`` saved a checkpoint (with :meth:`on_checkpoint`)."""

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        """For every result ``trial`` reports (a copy: of what is set on it, only
        ``result[SHOULD_CHECKPOINT] = True`` is acted on, as a request for a checkpoint)."""

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """When ``trial`` ends without error (done, a stop condition, or the scheduler)."""

    def on_trial_recover(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """When ``trial`` failed and will be retried (``max_failures``)."""

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        """When ``trial`` errored for good."""

    def on_checkpoint(
        self, iteration: int, trials: list[Trial], trial: Trial, checkpoint: Any, **info: Any
    ) -> None:
        """When ``trial`` saved ``checkpoint`` (a :class:`popflow.tune.Checkpoint`)."""

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        """When the experiment has finished (not when a time budget or an error ends the run)."""

    def get_state(self) -> dict[str, Any] | None:
        """What to keep across a resume (JSON-able); None: nothing."""
        return None

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`get_state` returned before the resume."""


class LoggerCallback(Callback):
    """Ray's ``tune.logger.LoggerCallback``: override the ``log_trial_*`` methods."""

    def log_trial_start(self, trial: Trial) -> None:
        """``trial`` started."""

    def log_trial_restore(self, trial: Trial) -> None:
        """``trial`` was restored (not called yet)."""

    def log_trial_save(self, trial: Trial) -> None:
        """``trial`` saved a checkpoint."""

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        """``trial`` reported ``result``."""

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        """``trial`` ended (``failed``: with an error)."""

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        self.log_trial_result(iteration, trial, result)

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_start(trial)

    def on_trial_restore(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_restore(trial)

    def on_trial_save(self, iteration: int, trials: list[Trial], trial: Trial, **info: Any) -> None:
        self.log_trial_save(trial)

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=False)

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.log_trial_end(trial, failed=True)


def check_callbacks(callbacks: Any) -> tuple[Callback, ...]:
    """``callbacks`` as given to ``run``/``RunConfig``: a list of :class:`Callback` objects."""
    if callbacks is None:
        return ()
    if isinstance(callbacks, Callback) or not isinstance(callbacks, Iterable):
        raise TypeError(f"`callbacks` must be a list of tune.Callback objects, got {callbacks!r}")
    out = tuple(callbacks)
    for cb in out:
        if not isinstance(cb, Callback):
            raise TypeError(
                f"`callbacks` holds {cb!r} ({type(cb).__name__}), which does not subclass "
                "popflow.tune.Callback"
            )
    return out


class Hooks:
    """The controller's side: calls each hook of every callback, in the order given.

    ``iteration`` and ``trials`` are asked for at each call (the round, the
    trial list). Trials get ``on_trial_start`` once per driver.
    """

    def __init__(
        self,
        callbacks: tuple[Callback, ...],
        iteration: Callable[[], int],
        trials: Callable[[], list[Trial]],
    ) -> None:
        self.callbacks = callbacks
        self._iteration = iteration
        self._trials = trials
        self._started: set[str] = set()
        #: the run's search algorithm on the driver (``Suggestions``), told of results and ends
        self.search: Any = None
        #: copies what callbacks wrote in the trials' ``local_path`` into remote storage
        #: (:mod:`popflow.flows.events.staging`; None: the experiment's storage is local)
        self.staging: Staging | None = None

    def use_storage(self, storage: Storage, fresh: bool = False) -> None:
        """The experiment's folder: on remote storage, what callbacks write in a trial's
        ``local_path`` is copied into the trial's folder there (each round, at its end).
        ``fresh``: a new experiment, whose staging folders start empty."""
        self.staging = None if storage.is_local else Staging(storage, fresh)

    def _sync(self, trials: list[Trial] | None = None) -> None:
        if self.staging is not None and self.callbacks:
            self.staging.sync(trials if trials is not None else self._trials())

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def _call(self, hook: str, **kwargs: Any) -> None:
        if not self.callbacks:
            return
        kwargs = {"iteration": self._iteration(), "trials": self._trials(), **kwargs}
        for cb in self.callbacks:
            getattr(cb, hook)(**kwargs)

    def setup(self, stop: Any, num_samples: int, total: int) -> None:
        for cb in self.callbacks:
            cb.setup(stop=stop, num_samples=num_samples, total_num_samples=total)

    def step_begin(self) -> None:
        self._call("on_step_begin")

    def step_end(self) -> None:
        self._call("on_step_end")
        self._sync()

    def trial_start(self, trial: Trial) -> None:
        if self.callbacks and trial.trial_id not in self._started:
            self._started.add(trial.trial_id)
            self._call("on_trial_start", trial=trial)

    def trial_result(self, trial: Trial, result: dict[str, Any]) -> bool:
        """Tell the searcher and the callbacks; whether a callback asked for a checkpoint
        at this result (``result[SHOULD_CHECKPOINT] = True`` on the copy it got, as Ray)."""
        if self.search is not None:
            self.search.trial_result(trial, result)
        if not self.callbacks:
            return False
        told = dict(result)
        self._call("on_trial_result", trial=trial, result=told)
        return bool(told.get(SHOULD_CHECKPOINT)) and not result.get(SHOULD_CHECKPOINT)

    @property
    def see_each_result(self) -> bool:
        """A callback of the user's acts on results (``on_trial_result``, not a logger's):
        it sees each result before the trial's next step, as in Ray, so that the
        checkpoint it may ask for is of that result's state."""
        return any(
            type(cb).on_trial_result is not Callback.on_trial_result
            and not isinstance(cb, LoggerCallback)
            for cb in self.callbacks
        )

    def trial_complete(self, trial: Trial) -> None:
        if self.search is not None:
            self.search.trial_complete(trial)
        self._call("on_trial_complete", trial=trial)
        self._sync([trial])

    def trial_recover(self, trial: Trial) -> None:
        self._call("on_trial_recover", trial=trial)

    def trial_error(self, trial: Trial) -> None:
        if self.search is not None:
            self.search.trial_error(trial)
        self._call("on_trial_error", trial=trial)
        self._sync([trial])

    def checkpoint(self, trial: Trial, checkpoint: Any) -> None:
        self._call("on_trial_save", trial=trial)
        self._call("on_checkpoint", trial=trial, checkpoint=checkpoint)

    def experiment_end(self) -> None:
        for cb in self.callbacks:
            cb.on_experiment_end(trials=self._trials())
        self._sync()
        if self.staging is not None:
            self.staging.close()

    def state(self) -> list[Any] | None:
        """Every callback's ``get_state()``, for the commit (None: none keeps any)."""
        states = [cb.get_state() for cb in self.callbacks]
        return states if any(s is not None for s in states) else None

    def set_state(self, states: list[Any] | None) -> None:
        if not states or len(states) != len(self.callbacks):
            return  # a resume with other callbacks: they start afresh
        for cb, state in zip(self.callbacks, states, strict=True):
            if state is not None:
                cb.set_state(state)

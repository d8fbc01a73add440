"""Ray Tune's grouped configs, each checking itself: ``TuneConfig``, ``RunConfig``,
``FailureConfig`` (``CheckpointConfig`` is in :mod:`popflow.flows.spec.config`).

Field names and defaults are Ray Tune's (2.x); popflow's own extras are keyword
fields at the end (``TuneConfig.seed``, ``RunConfig.storage_options``). They are
the run's groups of arguments: ``popflow.run`` builds them from its keywords,
``Tuner`` takes them as given, and :func:`~popflow.flows.spec.run_spec.run_spec`
puts them into the :class:`~popflow.flows.spec.run_spec.RunSpec`. A bad value
fails where the group is made, naming the argument, its value and the rule. What
Ray accepts and popflow does not do yet raises :class:`Unsupported`: never ignored
in silence.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from popflow.flows.events.callbacks import check_callbacks
from popflow.flows.spec.config import CheckpointConfig, check_verbose
from popflow.flows.spec.experiment_name import check_name
from popflow.infra.storage.credentials import StorageOptions, password_out_of_url
from popflow.schedulers import TrialScheduler
from popflow.schedulers.search import check_searcher
from popflow.schedulers.validation import check_real, is_int
from popflow.tasks.trial_output import log_files


class Unsupported(ValueError):
    """A Ray Tune argument popflow cannot honour (yet)."""

    def __init__(self, argument: str, value: Any, what_to_do: str) -> None:
        super().__init__(f"popflow does not support `{argument}={value!r}`: {what_to_do}")
        self.argument = argument


def refuse(argument: str, value: Any, default: Any, what_to_do: str) -> None:
    """:class:`Unsupported` unless ``value`` is Ray's ``default`` (what popflow does)."""
    if value != default:
        raise Unsupported(argument, value, what_to_do)


@dataclass(frozen=True)
class FailureConfig:
    """Ray's ``FailureConfig``: ``max_failures`` retries per trial (-1: forever)."""

    max_failures: int = 0
    fail_fast: bool | str = False  # True: end at the first trial error; "raise": raise it too

    def __post_init__(self) -> None:
        if not is_int(self.max_failures) or self.max_failures < -1:
            raise ValueError(
                f"`max_failures` is {self.max_failures!r}, but must be an int >= -1 "
                "(-1: retry forever)"
            )
        if not (isinstance(self.fail_fast, bool) or self.fail_fast == "raise"):
            raise ValueError(
                f"`fail_fast` is {self.fail_fast!r}, but must be False, True or 'raise'"
            )


@dataclass(frozen=True)
class TuneConfig:
    """Ray's ``TuneConfig``: what is tuned and how many trials; ``seed`` (popflow) makes
    the run repeat exactly. ``max_concurrent_trials`` 0 or None: no limit."""

    mode: str | None = None
    metric: str | None = None
    search_alg: Any = None
    scheduler: TrialScheduler | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    # popflow keeps trainables live between segments when it can (``reset_config``)
    reuse_actors: bool = False
    trial_name_creator: Callable[..., str] | None = None
    trial_dirname_creator: Callable[..., str] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check_searcher(self.search_alg)
        if not isinstance(self.reuse_actors, bool):
            raise TypeError(f"`reuse_actors` must be a bool, got {self.reuse_actors!r}")
        if self.scheduler is not None and not isinstance(self.scheduler, TrialScheduler):
            raise TypeError(f"`scheduler` must be a popflow.TrialScheduler, got {self.scheduler!r}")
        if not is_int(self.num_samples) or self.num_samples < 1:
            raise ValueError(f"`num_samples` is {self.num_samples!r}, but must be an int >= 1")
        if self.metric is not None and not isinstance(self.metric, str):
            raise TypeError(
                f"`metric` is {self.metric!r}, but must be a result key (a string) or None"
            )
        if self.mode is not None and self.mode not in ("min", "max"):
            raise ValueError(f"`mode` is {self.mode!r}, but must be 'min' or 'max'")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise TypeError(f"`seed` is {self.seed!r}, but must be an int >= 0 or None")
        check_real("time_budget_s", self.time_budget_s, low=0, strict=True, optional=True)
        limit = self.max_concurrent_trials
        if limit is not None and (not is_int(limit) or limit < 0):
            raise ValueError(
                f"`max_concurrent_trials` is {limit!r}, but must be an int >= 1 "
                "(0 or None: no limit)"
            )
        for argument, creator in (
            ("trial_name_creator", self.trial_name_creator),
            ("trial_dirname_creator", self.trial_dirname_creator),
        ):
            if creator is not None and not callable(creator):
                raise TypeError(f"`{argument}` is {creator!r}, but must be a function of the trial")


@dataclass(frozen=True)
class RunConfig:
    """Ray's ``RunConfig``: the experiment's name, where it goes, when trials stop, what
    the console shows. Results go to ``<storage_path>/<name>/`` (a folder or an fsspec
    URL such as ``s3://bucket/prefix``, with ``storage_options`` for fsspec).

    ``storage_options`` is kept as a
    :class:`~popflow.infra.storage.credentials.StorageOptions` (``.value``: the dict):
    its credentials never show in a repr, and a pickled RunConfig (a ``Tuner``'s, a
    Prefect flow's parameter or result) carries none; Prefect records a RunConfig
    parameter that holds storage options as ``"<RunConfig>"``."""

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    sync_config: Any = None
    verbose: int | None = None
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None
    callbacks: list[Any] | None = None
    progress_reporter: Any = None
    log_to_file: bool | str | tuple[str, str] = False
    local_dir: str | None = None
    storage_options: dict[str, Any] | StorageOptions | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._password_into_options()
        if self.storage_options is not None:  # credentials: never printed nor pickled
            object.__setattr__(self, "storage_options", StorageOptions(self.storage_options))
        refuse(
            "storage_filesystem",
            self.storage_filesystem,
            None,
            "pass an fsspec URL as `storage_path` and its options as `storage_options`",
        )
        refuse("sync_config", self.sync_config, None, "storage is written directly; drop it")
        refuse("local_dir", self.local_dir, None, "use `storage_path`")
        refuse(
            "progress_reporter",
            self.progress_reporter,
            None,
            "popflow draws its own trial table; `verbose` (0-3) sets how much it shows",
        )
        log_files(self.log_to_file)  # a bad value fails here, naming it
        check_verbose(self.verbose)
        if self.name is not None:
            check_name(self.name)
        check_stop(self.stop)
        check_callbacks(self.callbacks)
        for argument, value, kind in (
            ("checkpoint_config", self.checkpoint_config, CheckpointConfig),
            ("failure_config", self.failure_config, FailureConfig),
        ):
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"`{argument}` is {value!r}, but must be a popflow.{kind.__name__}")

    def _password_into_options(self) -> None:
        """A password in ``storage_path`` (``sftp://user:pw@host/x``) moves to
        ``storage_options["password"]`` (fsspec's option for it), where it is kept as a
        credential: never in a repr or a pickle."""
        if not isinstance(self.storage_path, str):
            return
        url, password = password_out_of_url(self.storage_path)
        if password is None:
            return
        options = dict(StorageOptions(self.storage_options).value)
        if options.setdefault("password", password) != password:
            raise ValueError(
                "`storage_path` holds a password and `storage_options` another: give one"
            )
        object.__setattr__(self, "storage_path", url)
        object.__setattr__(self, "storage_options", options)


def check_stop(stop: Any) -> None:
    """``stop``: None, a callable ``(trial_id, result) -> bool``, or a dict of result keys
    to numbers (a trial stops once ``result[key] >= bound``)."""
    if stop is None or (callable(stop) and not isinstance(stop, Mapping)):
        return
    if not isinstance(stop, Mapping):
        raise TypeError(
            f"`stop` must be a dict, a callable (trial_id, result) -> bool, or None; got {stop!r}"
        )
    for key, bound in stop.items():
        if not isinstance(key, str):
            raise TypeError(f"`stop` key {key!r} must be a string (a result key)")
        if not isinstance(bound, numbers.Real):  # True counts: Ray's {"done": True}
            raise TypeError(
                f"`stop[{key!r}]` is {bound!r} ({type(bound).__name__}), but must be a number "
                "(a trial stops once result[key] >= it)"
            )
        if math.isnan(bound):  # no result is >= NaN: the trial would never stop by it
            raise ValueError(
                f"`stop[{key!r}]` is {bound!r}, but must be a number, not NaN (a trial stops "
                "once result[key] >= it; infinity: never by this key)"
            )

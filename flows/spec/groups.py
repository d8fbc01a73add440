"""popflow's own groups of a run's arguments, beside Ray's (:mod:`popflow.flows.spec.ray_configs`):
where the experiment is written and how often, the cluster, the run's budget, and
how it resumes. Frozen; each checks itself when made, naming the argument, its value
and the rule, so a bad one fails before anything starts or is written. Field names
are ``popflow.run``'s keywords.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distributed import Client

from popflow.flows.spec.config import check_resources
from popflow.infra.cluster.dask_cluster import (
    check_embedded_workers,
    dask_resources,
    default_workers,
    embedded_size,
    gpus_available,
)
from popflow.infra.storage.folder import Storage
from popflow.schedulers.validation import check_real, is_int

ERRORED_VALUES = ("skip", "resume", "restart")


@dataclass(frozen=True)
class StorageSpec:
    """Where the experiment lives and how the driver writes it.

    - ``storage``: the root, a local folder or an fsspec URL with its options (its
      credentials hidden, see :mod:`popflow.infra.storage.credentials`);
    - ``commit_interval``: seconds between rounds' commits (finite: infinity would
      commit nothing until the end);
    - ``log_flush_interval``: on object stores, seconds between rewrites of the trials'
      logs;
    - ``lease_ttl``: seconds a stalled driver's lease blocks another driver.
    """

    storage: Storage
    commit_interval: float = 1.0
    log_flush_interval: float = 30.0
    lease_ttl: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.storage, Storage):
            raise TypeError(f"`storage` is {self.storage!r}, but must be a popflow Storage")
        check_real("commit_interval", self.commit_interval, low=0, strict=True, finite=True)
        check_real("log_flush_interval", self.log_flush_interval, low=0, strict=False)
        check_real("lease_ttl", self.lease_ttl, low=0, strict=True, finite=True)


@dataclass(frozen=True)
class ClusterSpec:
    """Where segments run: ``dask_address`` (an existing scheduler's address or a
    Client; None: an embedded cluster of ``n_workers``), and what one trial holds
    there (``resources_per_trial`` in Ray's names, ``resources`` in Dask's)."""

    dask_address: str | Client | None = None
    n_workers: int | None = None
    resources_per_trial: dict[str, float] | None = None
    resources: dict[str, float] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.dask_address is not None and not isinstance(self.dask_address, str | Client):
            raise TypeError(
                f"`dask_address` is {self.dask_address!r}, but must be a scheduler address "
                "such as 'tcp://host:8786', a distributed.Client, or None"
            )
        if self.n_workers is not None and (not is_int(self.n_workers) or self.n_workers < 1):
            raise TypeError(f"`n_workers` is {self.n_workers!r}, but must be an int >= 1 or None")
        if self.resources_per_trial is not None:
            check_resources("resources_per_trial", self.resources_per_trial)
        object.__setattr__(self, "resources", dask_resources(self.resources_per_trial))
        if self.dask_address is None:  # the embedded cluster: this machine's
            if self.n_workers is not None:
                check_embedded_workers("n_workers", self.n_workers)
            self._check_fits()

    def _check_fits(self) -> None:
        """A trial must fit one embedded worker (as in Ray, where a trial bigger than the
        machine is refused): said now, before anything is written or started, rather
        than once the workers are up."""
        trial = self.resources or {}
        if not trial:
            return
        gpus = gpus_available() if trial.get("GPU") else 0
        size = embedded_size(
            default_workers(), trial.get("CPU"), self.n_workers, gpus, trial.get("GPU")
        )
        for name, amount in trial.items():
            offered = size.resources.get(name, 0.0)
            if amount > offered:
                ray_name = {"CPU": "cpu", "GPU": "gpu"}.get(name, name)
                raise ValueError(
                    f"`resources_per_trial[{ray_name!r}]` is {amount:g}, but the embedded "
                    f"cluster's {size.n_workers} workers offer {offered:g} {name} each "
                    f"(workers offer {size.resources}): ask for at most that, use fewer "
                    "embedded workers (n_workers), popflow.init(num_cpus=..., num_gpus=...), "
                    "or a Dask cluster of your own (dask_address)"
                )


@dataclass(frozen=True)
class BudgetSpec:
    """What ends this run (or a segment) before the experiment ends: ``max_rounds`` or
    ``run_budget_s`` seconds of this run (the experiment stays resumable), and
    ``segment_timeout_s``, after which a segment errors its trial. (Ray's
    ``time_budget_s``, in :class:`~popflow.flows.spec.ray_configs.TuneConfig`, ends the
    experiment.)"""

    max_rounds: int | None = None
    segment_timeout_s: float | None = None
    run_budget_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_rounds is not None and (not is_int(self.max_rounds) or self.max_rounds < 1):
            raise ValueError(
                f"`max_rounds` is {self.max_rounds!r}, but must be an int >= 1 or None"
            )
        check_real("segment_timeout_s", self.segment_timeout_s, low=0, strict=True, optional=True)
        check_real("run_budget_s", self.run_budget_s, low=0, strict=True, optional=True)


@dataclass(frozen=True)
class ResumeSpec:
    """Whether the run continues an experiment (``resume``: False, True or "auto") and
    what its errored trials do then (``errored``: "skip", "resume" or "restart") and its
    unfinished ones (``resume_unfinished``: True goes on with them; False ends them, TERMINATED,
    Ray's ``resume_unfinished=False``)."""

    resume: bool | str = False
    errored: str = "skip"
    resume_unfinished: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.resume, bool) or self.resume == "auto"):
            raise ValueError(f"`resume` is {self.resume!r}, but must be False, True or 'auto'")
        if self.errored not in ERRORED_VALUES:
            raise ValueError(
                f"`errored` is {self.errored!r}, but must be 'skip', 'resume' or 'restart'"
            )
        if not isinstance(self.resume_unfinished, bool):
            raise TypeError(f"`resume_unfinished` is {self.resume_unfinished!r}, but must be a bool")

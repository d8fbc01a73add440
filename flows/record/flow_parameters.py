"""The ``tune`` flow run's parameters as the Prefect UI shows them.

Prefect stores a flow run's parameters as JSON, and shows ``"<RunSpec>"`` for
what it cannot encode. :class:`Shown` carries the object the flow needs and
gives Prefect a readable view of it instead: the trainable by import path,
the experiment's storage URL (never its credentials), the scheduler with its
arguments, ``num_samples``, ``stop``, metric, mode and seed; the cluster as
its address.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: arguments kept under another name (PBT's ``synch`` is its ``synchronous``)
_KEPT_AS = {"synch": "synchronous"}
#: how deep a nested argument is shown, and how many items of a long list
_DEPTH = 4
_ITEMS = 20


class Shown(Generic[T]):
    """``value``, which Prefect's JSON encoder shows as ``view`` (it takes an object it
    cannot encode otherwise as ``dict(obj)``; a dataclass it would copy field by field)."""

    def __init__(self, value: T, view: Mapping[str, Any]) -> None:
        self.value = value
        self._view = dict(view)

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        return iter(self._view.items())

    def __repr__(self) -> str:
        return f"Shown({self._view!r})"


def readable(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON a person can read: plain values as they are, a callable or a
    class by its import path, anything else by its ``repr``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth >= _DEPTH:
        return repr(value)
    if isinstance(value, Mapping):
        return {str(k): readable(v, depth + 1) for k, v in list(value.items())[:_ITEMS]}
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        shown = [readable(v, depth + 1) for v in items[:_ITEMS]]
        return shown + ([f"... {len(items) - _ITEMS} more"] if len(items) > _ITEMS else [])
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value):
        return import_path(value)
    item = getattr(value, "item", None)  # a numpy scalar
    if callable(item) and getattr(value, "shape", None) == ():
        return readable(item(), depth)
    return repr(value)


def import_path(obj: Any) -> str:
    """``module:qualname``, what ``popflow.flows.experiment.opening`` takes back."""
    module = getattr(obj, "__module__", None) or "?"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{module}:{name}"


def scheduler_arguments(scheduler: Any) -> dict[str, Any]:
    """The arguments ``scheduler`` was made with, as far as it keeps them (an argument
    ``x`` is read back from its attribute ``x`` or ``_x``; the generator is left out)."""
    out: dict[str, Any] = {}
    try:
        parameters = inspect.signature(type(scheduler).__init__).parameters
    except (TypeError, ValueError):
        return out
    for name, parameter in parameters.items():
        if name in ("self", "rng") or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        for attribute in (name, f"_{name}", _KEPT_AS.get(name, name)):
            if hasattr(scheduler, attribute):
                out[name] = readable(getattr(scheduler, attribute))
                break
    return out


def spec_view(spec: Any) -> dict[str, Any]:
    """What the UI shows of a :class:`~popflow.flows.spec.run_spec.RunSpec`."""
    return {
        "trainable": import_path(spec.trainable),
        "storage": spec.experiment_storage.url,
        "scheduler": {
            "class": type(spec.scheduler).__name__,
            **scheduler_arguments(spec.scheduler),
        },
        "num_samples": spec.num_samples,
        "stop": readable(spec.stop),
        "metric": spec.metric,
        "mode": spec.mode,
        "seed": spec.seed,
        "param_space": readable(spec.param_space),
        "resources_per_trial": readable(spec.resources_per_trial),
        "max_failures": spec.max_failures,
        "resume": readable(spec.resume),
        "max_rounds": spec.max_rounds,
        "time_budget_s": spec.time_budget_s,
        "run_budget_s": spec.run_budget_s,
    }


def runs_experiment(parameters: Mapping[str, Any] | None, name: str, url: str | None) -> bool:
    """Whether a ``tune`` flow run with ``parameters`` (as the API holds them) ran the
    experiment ``name`` at ``url`` (None: any storage). Two experiments may share a name
    in different storage: the name alone would mix up their runs."""
    parameters = parameters or {}
    if parameters.get("name") != name:
        return False
    spec = parameters.get("spec")
    stored = spec.get("storage") if isinstance(spec, Mapping) else None
    return url is None or stored is None or stored == url


def cluster_view(cluster: Any, n_workers: int | None) -> dict[str, Any]:
    """What the UI shows of the cluster a run is given: its address, or the embedded one."""
    if cluster is None or type(cluster).__name__ == "ClusterStart":
        return {"cluster": "embedded", "n_workers": n_workers}
    address = getattr(getattr(cluster, "scheduler", None), "address", None)
    return {"cluster": address or str(cluster)}

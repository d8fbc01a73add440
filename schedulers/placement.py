"""Ray's ``PlacementGroupFactory`` as plain data: what one trial holds.

A trial's resources are a list of bundles (``{"CPU": 2, "GPU": 0.5}``); on popflow
they sum to what the trial holds in one Dask slot on one worker (Ray may place
bundles on several nodes: popflow never does). Ray's strategies (``PACK``,
``SPREAD``, ``STRICT_PACK``, ``STRICT_SPREAD``) are accepted and kept, and change
nothing: every bundle lands in the trial's one slot.

>>> pgf = PlacementGroupFactory([{"CPU": 1, "GPU": 0}, {"CPU": 2}])
>>> pgf.required_resources, pgf.head_cpus
({'CPU': 3.0}, 1.0)
>>> PlacementGroupFactory.from_json(pgf.to_json()) == pgf
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: Ray's placement strategies (all mean "one slot" on popflow).
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
#: Ray's resource names as Dask workers declare them (others keep their own name).
_DASK_NAMES = {"cpu": "CPU", "gpu": "GPU"}


def _bundle(i: int, bundle: Any) -> dict[str, float]:
    if not isinstance(bundle, Mapping):
        raise TypeError(f"bundle {i} is {bundle!r}, but must be a dict such as {{'CPU': 1}}")
    out: dict[str, float] = {}
    for name, amount in bundle.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"bundle {i} has the key {name!r}, but keys must be resource names")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise TypeError(f"bundle {i}[{name!r}] is {amount!r}, but must be a number >= 0")
        if not (amount >= 0 and math.isfinite(amount)):
            raise ValueError(
                f"bundle {i}[{name!r}] is {amount!r}, but must be a finite number >= 0"
            )
        out[_DASK_NAMES.get(name.lower(), name)] = float(amount)
    return out


class PlacementGroupFactory:
    """Ray's ``PlacementGroupFactory(bundles, strategy="PACK")``: the resources of one trial.

    ``bundles``: a non-empty list of resource dicts; the first is the head bundle (the
    trainable's own). An empty first bundle (``[{}, {"CPU": 2}]``) is Ray's "head
    bundle is empty": ``head_cpus`` is 0 then. Other arguments of Ray's (``name``,
    ``lifetime``) are kept and ignored.
    """

    def __init__(
        self,
        bundles: Sequence[Mapping[str, float]],
        strategy: str = "PACK",
        *args: Any,
        **kwargs: Any,
    ) -> None:
        if isinstance(bundles, Mapping) or not isinstance(bundles, Sequence) or not bundles:
            raise ValueError(
                f"`bundles` is {bundles!r}, but must be a non-empty list of dicts such as "
                "[{'CPU': 1, 'GPU': 0}]"
            )
        if strategy not in STRATEGIES:
            raise ValueError(
                f"`strategy` is {strategy!r}, but must be one of {', '.join(STRATEGIES)}"
            )
        parsed = [_bundle(i, b) for i, b in enumerate(bundles)]
        self._head_bundle_is_empty = not any(parsed[0].values()) and len(parsed) > 1
        self._bundles = parsed
        self.strategy = strategy
        self._args = args
        self._kwargs = kwargs

    @property
    def bundles(self) -> list[dict[str, float]]:
        """The bundles (copies), as given (in Dask's names: ``CPU``, ``GPU``)."""
        return [dict(b) for b in self._bundles]

    @property
    def head_bundle_is_empty(self) -> bool:
        return self._head_bundle_is_empty

    @property
    def head_cpus(self) -> float:
        """The head bundle's CPUs (0 when it is empty): Ray's ``nthread`` hint."""
        return 0.0 if self._head_bundle_is_empty else self._bundles[0].get("CPU", 0.0)

    @property
    def required_resources(self) -> dict[str, float]:
        """Every bundle summed: what the trial holds in its slot (zeros left out)."""
        total: dict[str, float] = {}
        for bundle in self._bundles:
            for name, amount in bundle.items():
                total[name] = total.get(name, 0.0) + amount
        return {k: v for k, v in total.items() if v}

    def dask_resources(self) -> dict[str, float] | None:
        """What the trial's Dask slot holds (None: nothing named)."""
        return self.required_resources or None

    @classmethod
    def from_resources(cls, resources: Mapping[str, float] | None) -> PlacementGroupFactory:
        """One bundle of ``resources`` (``{"cpu": 2}``, Ray's ``resources_per_trial``);
        Ray's default, ``[{"CPU": 1, "GPU": 0}]``, for None or nothing named."""
        if not resources:
            return cls([{"CPU": 1.0, "GPU": 0.0}])
        return cls([dict(resources)])

    def to_json(self) -> dict[str, Any]:
        return {"bundles": self.bundles, "strategy": self.strategy}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlacementGroupFactory:
        return cls(data["bundles"], data.get("strategy", "PACK"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlacementGroupFactory):
            return NotImplemented
        return (self._bundles, self.strategy) == (other._bundles, other.strategy)

    def __hash__(self) -> int:
        return hash((repr(self._bundles), self.strategy))

    def __reduce__(self) -> tuple[Any, ...]:
        return (PlacementGroupFactory, (self._bundles, self.strategy))

    def __repr__(self) -> str:
        return f"<PlacementGroupFactory (_bound=<BoundArguments (bundles={self._bundles}, strategy={self.strategy!r})>, head_bundle_is_empty={self._head_bundle_is_empty})>"

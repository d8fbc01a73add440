"""Ray Train's ``ScalingConfig``, for scripts that import it beside Tune.

popflow runs Tune's trainables and has no Ray Train trainers (``TorchTrainer`` and the like)
to hand a ``ScalingConfig`` to: a trial's resources are ``tune.with_resources`` /
``resources_per_trial``. The class exists so that ``from ray.train import ScalingConfig``
keeps importing, and it checks its arguments as Ray does; nothing in popflow reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Ray's placement strategies
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


@dataclass(frozen=True)
class ScalingConfig:
    """Ray Train's ``ScalingConfig(num_workers, use_gpu, resources_per_worker, ...)``."""

    trainer_resources: Mapping[str, float] | None = None
    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: Mapping[str, float] | None = None
    placement_strategy: str = "PACK"
    accelerator_type: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int):
            raise TypeError(f"`num_workers` is {self.num_workers!r}, but must be an int")
        if self.num_workers < 1:
            raise ValueError(f"`num_workers` is {self.num_workers}, but must be >= 1")
        if self.placement_strategy not in STRATEGIES:
            raise ValueError(
                f"`placement_strategy` is {self.placement_strategy!r}, but must be one of {STRATEGIES}"
            )

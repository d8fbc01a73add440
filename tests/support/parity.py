"""PBT of the parity trainable, as the end-to-end tests run it: one trial a value of
``a``, maximising ``mean_accuracy``; exploits copy ``a`` and so are visible in the results."""

from __future__ import annotations

from typing import Any

from trainables import ParityTrainable, SleepyTrainable

from popflow import ResultGrid, run
from popflow.schedulers import PopulationBasedTraining, sample_from


def parity_scheduler(synch: bool) -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"c": lambda: 1},
        synch=synch,
    )


def parity_space(values: list[int]) -> dict:
    # sample_from sees the trial index through a closure over an iterator, like Ray's MockParam
    it = iter(values)
    return {"a": sample_from(lambda _: next(it)), "c": 1}


def parity_run(
    values: list[int], synch: bool = True, iterations: int = 3, **kwargs: Any
) -> ResultGrid:
    """``run`` of ParityTrainable, a trial for each of ``values``, under
    ``parity_scheduler(synch)``, ``iterations`` each (unless ``kwargs`` has a ``stop``)."""
    kwargs.setdefault("stop", {"training_iteration": iterations})
    return run(
        ParityTrainable,
        parity_space(values),
        scheduler=parity_scheduler(synch),
        metric="mean_accuracy",
        mode="max",
        num_samples=len(values),
        **kwargs,
    )


def sleepy_run(name: str, sleep: float, iterations: int = 3, **kwargs: Any) -> ResultGrid:
    """Synchronous PBT of SleepyTrainable (a step of ``sleep`` s), two trials, ``iterations``
    iterations each: a run whose rounds take measurable time, named ``name``."""
    return run(
        SleepyTrainable,
        {**parity_space([10, 20]), "sleep": sleep},
        scheduler=parity_scheduler(synch=True),
        metric="mean_accuracy",
        mode="max",
        num_samples=2,
        stop={"training_iteration": iterations},
        name=name,
        **kwargs,
    )

"""Argument checks shared by the schedulers, the search spaces and ``popflow.run``'s
arguments (errors that name the argument, its value and the rule)."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any


def is_int(value: Any) -> bool:
    """An integer, and not a bool (``True`` is no count)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number (NaN and infinities included), and not a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, *, low: int, optional: bool = False) -> None:
    """TypeError naming ``name`` unless ``value`` is an int (None too if ``optional``);
    ValueError unless it is ``>= low``."""
    if value is None and optional:
        return
    rule = f">= {low}" + (" or None" if optional else "")
    if not is_int(value):
        raise TypeError(f"`{name}` is {value!r}, but must be an int {rule}")
    if value < low:
        raise ValueError(f"`{name}` is {value!r}, but must be {rule}")


def check_real(
    name: str,
    value: Any,
    *,
    low: float,
    strict: bool,
    optional: bool = False,
    finite: bool = False,
) -> None:
    """TypeError naming ``name`` unless ``value`` is a number (None too if ``optional``);
    ValueError unless it is ``> low`` (``strict``) or ``>= low``, not NaN, and finite if
    ``finite``."""
    if value is None and optional:
        return
    sign = ">" if strict else ">="
    if not is_real(value):
        raise TypeError(f"`{name}` is {value!r}, but must be a number {sign} {low}")
    if math.isnan(value) or not (value > low if strict else value >= low):
        raise ValueError(f"`{name}` is {value!r}, but must be {sign} {low}")
    if finite and math.isinf(value):
        raise ValueError(f"`{name}` is {value!r}, but must be finite")


def check_mode(mode: str | None) -> None:
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")


def check_positive(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is a real number > 0 (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
        raise ValueError(f"`{name}` is {value!r}, but must be > 0")


def check_bool(name: str, value: Any) -> None:
    """TypeError naming ``name`` unless ``value`` is True or False ("no" is not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` is {value!r}, but must be True or False")


def check_finite_positive(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is a finite real number > 0."""
    check_positive(name, value)
    if not math.isfinite(value):
        raise ValueError(f"`{name}` is {value!r}, but must be finite")


#: Rungs (or brackets) a successive-halving plan may have; past this, a reduction
#: factor barely above 1 would make a constructor run for minutes.
MAX_RUNGS = 1000


def check_rung_count(reduction_factor: float, max_t: float, min_t: float = 1.0) -> None:
    """ValueError when ``min_t * eta**k <= max_t`` holds for more than MAX_RUNGS values of k."""
    if max_t <= min_t:
        return
    # logs apart: max_t / min_t overflows to inf for 1e300 / 1e-300
    rungs = math.floor((math.log(max_t) - math.log(min_t)) / math.log(reduction_factor)) + 1
    if rungs > MAX_RUNGS:
        raise ValueError(
            f"`reduction_factor` is {reduction_factor!r} with `max_t` {max_t!r} (from "
            f"{min_t!r}): that makes {rungs:,} rungs, but popflow allows at most "
            f"{MAX_RUNGS:,}; use a larger reduction_factor or a smaller max_t"
        )


#: HyperBand brackets (``s_max + 1``) a plan may have: its exact plan costs about
#: ``s_max**3`` big-number operations (0.4 s at 100 brackets with η=1.05, 16 s at 300),
#: and a bracket past the first few needs ``η**s_max`` trials before a run reaches it.
MAX_HYPERBAND_BRACKETS = 100


def check_hyperband_brackets(reduction_factor: float, max_t: float) -> None:
    """ValueError when HyperBand's plan for ``max_t`` and ``reduction_factor`` would have
    more than MAX_HYPERBAND_BRACKETS brackets."""
    if max_t < reduction_factor:
        return
    brackets = math.floor(math.log(max_t) / math.log(reduction_factor)) + 1
    if brackets > MAX_HYPERBAND_BRACKETS:
        raise ValueError(
            f"`reduction_factor` is {reduction_factor!r} with `max_t` {max_t!r}: that makes "
            f"{brackets:,} HyperBand brackets (s_max = floor(log(max_t) / "
            f"log(reduction_factor))), but popflow allows at most {MAX_HYPERBAND_BRACKETS} "
            f"(the first alone holds about reduction_factor**s_max trials); use a larger "
            "reduction_factor or a smaller max_t"
        )


def check_pbt_arguments(
    hyperparam_mutations: Any,
    custom_explore_fn: Any,
    quantile_fraction: Any,
    resample_probability: Any,
    perturbation_interval: Any,
    burn_in_period: Any,
    perturbation_factors: Any,
    *,
    synch: Any,
    log_config: Any,
    require_attrs: Any,
) -> None:
    """PBT's (and PB2's) arguments, as Ray's constructor checks them (the mutations' own
    shape: :func:`~popflow.schedulers.pbt_explore.validate_mutations`)."""
    if not hyperparam_mutations and custom_explore_fn is None:
        raise ValueError(
            f"`hyperparam_mutations` is {hyperparam_mutations!r} and `custom_explore_fn` "
            "is None, but PBT needs at least one of them to explore"
        )
    if custom_explore_fn is not None and not callable(custom_explore_fn):
        raise ValueError(
            f"`custom_explore_fn` is {custom_explore_fn!r}, but must be a callable "
            "f(config) -> config"
        )
    if not 0 <= quantile_fraction <= 0.5:
        raise ValueError(
            f"`quantile_fraction` is {quantile_fraction!r}, "
            "but must be between 0 and 0.5 (inclusive)"
        )
    if not 0 <= resample_probability <= 1:
        raise ValueError(
            f"`resample_probability` is {resample_probability!r}, "
            "but must be between 0 and 1 (inclusive)"
        )
    if not perturbation_interval > 0:
        raise ValueError(f"`perturbation_interval` is {perturbation_interval!r}, but must be > 0")
    if not burn_in_period >= 0:
        raise ValueError(f"`burn_in_period` is {burn_in_period!r}, but must be >= 0")
    if len(perturbation_factors) == 0:
        raise ValueError(
            f"`perturbation_factors` is {perturbation_factors!r}, but must hold at least one factor"
        )
    if not all(isinstance(f, Real) and not isinstance(f, bool) for f in perturbation_factors):
        raise TypeError(
            f"`perturbation_factors` is {perturbation_factors!r}, but must hold numbers "
            "(factors such as 1.2 and 0.8)"
        )
    for flag, value in (("synch", synch), ("log_config", log_config)):
        check_bool(flag, value)
    check_bool("require_attrs", require_attrs)

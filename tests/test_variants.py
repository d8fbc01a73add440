"""Variant generation: grid crossing, sampling, sample_from order, tags, validation."""

from __future__ import annotations

import copy
import doctest
import itertools
import json
import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from popflow.schedulers import variants as variants_module
from popflow.schedulers.domains import Domain
from popflow.schedulers.search_space import (
    choice,
    grid_search,
    loguniform,
    qrandint,
    randint,
    randn,
    sample_from,
    uniform,
)
from popflow.schedulers.variants import (
    count_variants,
    format_vars,
    generate_variants,
    resolve_variants,
)

pytestmark = pytest.mark.unit


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for child in value.values() for leaf in leaves(child)]
    if isinstance(value, list | tuple):
        return [leaf for child in value for leaf in leaves(child)]
    return [value]


# -- random param spaces for properties -------------------------------------------------
DOMAINS = st.sampled_from(
    [
        uniform(0, 1),
        loguniform(1e-4, 1e-1),
        randint(0, 10),
        qrandint(0, 100, 5),
        randn(),
        choice(["x", "y", "z"]),
    ]
)
PLAIN = st.integers(-5, 5) | st.text("pq", max_size=2) | st.lists(st.integers(0, 3), max_size=3)
GRIDS = st.lists(st.integers(0, 9), min_size=1, max_size=3).map(grid_search)
KEYS = st.text("abcd", min_size=1, max_size=2)
SPACES = st.dictionaries(
    KEYS,
    st.recursive(
        PLAIN | DOMAINS | GRIDS,
        lambda children: st.dictionaries(KEYS, children, max_size=3),
        max_leaves=8,
    ),
    max_size=4,
)


def grid_sizes(space: Any) -> list[int]:
    if isinstance(space, dict) and "grid_search" in space and len(space) == 1:
        return [len(space["grid_search"])]
    if isinstance(space, dict):
        return [n for child in space.values() for n in grid_sizes(child)]
    return []


@settings(deadline=None, max_examples=examples(150))
@given(space=SPACES, num_samples=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_properties_of_random_spaces(space: dict, num_samples: int, seed: int) -> None:
    before = copy.deepcopy(space)
    variants = resolve_variants(space, num_samples, rng(seed))

    # count: the whole grid, num_samples times
    assert len(variants) == num_samples * math.prod(grid_sizes(space))
    assert count_variants(space, num_samples) == len(variants)
    assert [v.index for v in variants] == list(range(len(variants)))
    # fully resolved, JSON-ready, plain Python values
    for v in variants:
        for leaf in leaves(v.config):
            assert not isinstance(leaf, Domain)
            assert not isinstance(leaf, np.generic)
        assert json.loads(json.dumps(v.config)) == v.config
    # the input is untouched
    assert space == before
    # deterministic for a fixed generator state, and generate_variants agrees
    again = resolve_variants(space, num_samples, rng(seed))
    assert [(v.tag, v.config) for v in again] == [(v.tag, v.config) for v in variants]
    assert generate_variants(space, num_samples, rng(seed)) == [v.config for v in variants]


# -- grids ------------------------------------------------------------------------------
def test_grid_axes_are_crossed_first_sorted_axis_fastest_samples_outermost() -> None:
    space = {"b": grid_search([1, 2]), "a": grid_search(["x", "y"]), "c": 0}
    configs = generate_variants(space, 2, rng())
    assert [(c["a"], c["b"]) for c in configs] == [
        ("x", 1),
        ("y", 1),
        ("x", 2),
        ("y", 2),
    ] * 2
    assert all(c["c"] == 0 for c in configs)
    assert [list(c) for c in configs] == [["b", "a", "c"]] * 4 * 2  # key order kept


def test_every_grid_combination_appears_num_samples_times() -> None:
    space = {
        "act": grid_search(["relu", "tanh", "gelu"]),
        "model": {"depth": grid_search([1, 2]), "width": grid_search([8, 16])},
        "lr": uniform(0, 1),
    }
    configs = generate_variants(space, 3, rng())
    assert len(configs) == 3 * 3 * 2 * 2
    combos = Counter((c["act"], c["model"]["depth"], c["model"]["width"]) for c in configs)
    assert set(combos) == set(itertools.product(["relu", "tanh", "gelu"], [1, 2], [8, 16]))
    assert set(combos.values()) == {3}


def test_each_grid_point_samples_its_own_domains() -> None:
    configs = generate_variants({"g": grid_search([1, 2]), "lr": uniform(0, 1)}, 2, rng())
    assert len({c["lr"] for c in configs}) == 4


def test_pasted_json_grid_marker_is_a_grid() -> None:
    configs = generate_variants({"a": {"grid_search": [1, 2, 3]}}, 1, rng())
    assert configs == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_grid_value_holding_domains_and_grids_is_resolved() -> None:
    space = {"opt": grid_search([{"lr": uniform(0, 1)}, {"lr": grid_search([0.5, 0.25])}])}
    configs = generate_variants(space, 1, rng())
    assert len(configs) == 3
    assert 0 <= configs[0]["opt"]["lr"] <= 1
    assert [c["opt"]["lr"] for c in configs[1:]] == [0.5, 0.25]


# -- resolution ---------------------------------------------------------------------------
def test_plain_values_and_lists_pass_through_unchanged() -> None:
    space = {"layers": [64, 64], "name": "mlp", "opt": {"betas": (0.9, 0.99)}, "none": None}
    assert generate_variants(space, 2, rng()) == [space, space]


def test_nested_dicts_and_lists_are_resolved() -> None:
    space = {
        "model": {"width": qrandint(32, 256, 32), "act": choice(["relu", "tanh"])},
        "layers": [randint(1, 4), 7],
        "deep": {"er": {"lr": loguniform(1e-4, 1e-1)}},
    }
    for config in generate_variants(space, 20, rng()):
        assert config["model"]["width"] % 32 == 0 and 32 <= config["model"]["width"] <= 256
        assert config["model"]["act"] in ("relu", "tanh")
        assert config["layers"][0] in (1, 2, 3) and config["layers"][1] == 7
        assert 1e-4 <= config["deep"]["er"]["lr"] <= 1e-1


def test_sample_from_sees_resolved_domains_and_plain_values() -> None:
    space = {
        "double": sample_from(lambda spec: spec["lr"] * spec["factor"]),  # defined first
        "lr": uniform(0, 1),
        "factor": 2,
    }
    for config in generate_variants(space, 10, rng()):
        assert config["double"] == config["lr"] * 2


def test_sample_from_sees_grid_values_and_nested_values_ray_style() -> None:
    space = {
        "model": {"width": grid_search([8, 16])},
        "hidden": sample_from(lambda spec: spec.config.model.width * 4),
    }
    assert [c["hidden"] for c in generate_variants(space, 1, rng())] == [32, 64]


def test_sample_from_may_read_another_sample_from() -> None:
    space = {
        "c": sample_from(lambda spec: spec["b"] + 1),
        "b": sample_from(lambda spec: spec["a"] + 1),
        "a": randint(0, 100),
    }
    for config in generate_variants(space, 5, rng()):
        assert config["c"] == config["b"] + 1 == config["a"] + 2


def test_sample_from_get_also_waits_for_pending_values() -> None:
    space = {"c": sample_from(lambda spec: spec.get("b", -1) + 1), "b": sample_from(lambda: 5)}
    assert generate_variants(space, 1, rng()) == [{"c": 6, "b": 5}]


def test_sample_from_cycle_is_an_error() -> None:
    space = {"x": sample_from(lambda s: s["y"]), "y": sample_from(lambda s: s["x"])}
    with pytest.raises(ValueError, match=re.escape("sample_from at `x`, `y` cannot be resolved")):
        generate_variants(space, 1, rng())


def test_sample_from_zero_argument_and_in_tuples() -> None:
    space = {"pair": (1, sample_from(lambda: 2))}
    assert generate_variants(space, 1, rng()) == [{"pair": (1, 2)}]


def test_input_is_not_mutated_and_outputs_share_nothing() -> None:
    space = {"layers": [64, 64], "tags": {"x"}, "model": {"act": choice([["a"], ["b"]]), "w": 1}}
    before = copy.deepcopy(space)
    first, second = generate_variants(space, 2, rng())
    first["layers"].append(1)
    first["tags"].add("y")
    first["model"]["act"].append("mutated")
    first["model"]["w"] = 99
    assert space == before
    assert second["layers"] == [64, 64]
    assert second["tags"] == {"x"}
    assert "mutated" not in second["model"]["act"]


def test_same_seed_same_variants_other_seed_differs() -> None:
    space = {"lr": loguniform(1e-4, 1e-1), "g": grid_search([1, 2]), "m": randn()}
    assert generate_variants(space, 3, rng(5)) == generate_variants(space, 3, rng(5))
    assert generate_variants(space, 3, rng(5)) != generate_variants(space, 3, rng(6))


def test_generator_is_advanced_so_calls_continue_the_stream() -> None:
    generator = rng(0)
    first = generate_variants({"lr": uniform(0, 1)}, 1, generator)
    second = generate_variants({"lr": uniform(0, 1)}, 1, generator)
    assert first != second
    assert first + second == generate_variants({"lr": uniform(0, 1)}, 2, rng(0))


# -- tags ---------------------------------------------------------------------------------
def test_tags_are_index_then_searched_vars() -> None:
    space = {"act": grid_search(["relu", "tanh"]), "lr": choice([0.01]), "fixed": 3}
    assert [v.tag for v in resolve_variants(space, 2, rng())] == [
        "0_act=relu,lr=0.01",
        "1_act=tanh,lr=0.01",
        "2_act=relu,lr=0.01",
        "3_act=tanh,lr=0.01",
    ]


def test_tag_is_index_alone_when_nothing_is_searched() -> None:
    assert [v.tag for v in resolve_variants({"a": 1}, 3, rng())] == ["0", "1", "2"]


def test_resolved_vars_name_searched_paths_only() -> None:
    space = {
        "model": {"lr": uniform(0, 1), "act": "relu"},
        "g": grid_search([{"x": randint(0, 2)}]),
    }
    (variant,) = resolve_variants(space, 1, rng())
    assert list(variant.resolved_vars) == [("g", "x"), ("model", "lr")]
    assert variant.resolved_vars[("model", "lr")] == variant.config["model"]["lr"]


def test_format_vars_matches_rays_conventions() -> None:
    assert (
        format_vars(
            {("a", "b", "c"): 8.1234567, ("a", "b", "d"): [7, 8], ("a", "b", "e"): [[[3, 4]]]}
        )
        == "c=8.1235,d=7_8,e=3_4"
    )
    # sorted by the full path, named by the last key
    assert format_vars({("a", "c", "x"): [7, 8], ("a", "b", "x"): 8.1234567}) == "x=8.1235,x=7_8"
    # characters unsafe in directory names collapse to "_"
    assert format_vars({("a  c?x",): " <;%$ok ", ("some",): " "}) == "a_c_x=ok,some="
    assert format_vars({"lr": 1e-5, "act": "relu", "n": 3, "on": True}) == (
        "act=relu,lr=1e-05,n=3,on=True"
    )
    assert format_vars({}) == ""


# -- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (({"a": 1}, 0, rng()), ValueError, "`num_samples` is 0, but must be >= 1"),
        (({"a": 1}, -1, rng()), ValueError, "`num_samples` is -1, but must be >= 1"),
        (({"a": 1}, 1.5, rng()), TypeError, "`num_samples` is 1.5, but must be an integer"),
        (([1, 2], 1, rng()), TypeError, "`param_space` is [1, 2], but must be a dict"),
        (({"a": 1}, 1, 0), TypeError, "`rng` is 0, but must be a numpy.random.Generator"),
        (({"a": {"grid_search": []}}, 1, rng()), ValueError, "grid_search at `a` is empty"),
        (
            ({"m": {"a": {"grid_search": "ab"}}}, 1, rng()),
            TypeError,
            "grid_search at `m/a` is 'ab', but must be a list of values",
        ),
    ],
)
def test_invalid_arguments_raise_with_a_specific_message(args, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        generate_variants(*args)


def test_docstring_examples_run() -> None:
    failures, attempted = doctest.testmod(variants_module)
    assert attempted > 0
    assert failures == 0

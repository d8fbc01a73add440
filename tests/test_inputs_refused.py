"""Inputs an adversary would try are refused by ``popflow.run`` (and Ray's ``tune.run`` and
``Tuner``) before anything starts or is written: a message naming the argument, its value
and the rule, no cluster, no Prefect flow run, and nothing in ``storage``.

The unit tests here start nothing: ``run`` is watched by a tripwire on what it would start
next (the embedded cluster, the Prefect record, the training), so an input that got past
the checks fails the test at once instead of running (or retrying) for seconds.
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples
from trainables import ParityTrainable, parity_function

from popflow import CheckpointConfig, choice, grid_search, run, tune
from popflow.flows.api import launch
from popflow.flows.api.tuner import RunConfig, TuneConfig, Tuner
from popflow.flows.spec.experiment_name import MAX_NAME_PART_BYTES, check_name

pytestmark = pytest.mark.unit


class Started(AssertionError):
    """``run`` went past its checks: it started the cluster, Prefect or the training."""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args: Any, **kwargs: Any) -> Any:
        raise Started("run() started something for an input it should have refused")

    for started in ("ClusterStart", "PrefectRecord", "train"):
        monkeypatch.setattr(launch, started, tripwire)


def assert_nothing_in(storage: Path) -> None:
    assert not storage.exists() or not any(storage.iterdir()), sorted(storage.rglob("*"))


NAN, INF = math.nan, math.inf

#: (run()'s arguments over a good run's, the error, a regex its message matches)
REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    # stop: no result is >= NaN, so the trial would never stop (inf is allowed: never by it)
    (
        {"stop": {"training_iteration": NAN}},
        ValueError,
        r"`stop\['training_iteration'\]` is nan, but must be a number, not NaN",
    ),
    # resources: NaN and infinity fit no worker (or every one); a bool is no amount
    (
        {"resources_per_trial": {"cpu": NAN}},
        ValueError,
        r"`resources_per_trial\['cpu'\]` is nan, but must be a number >= 0 and finite",
    ),
    ({"resources_per_trial": {"cpu": INF}}, ValueError, r"`resources_per_trial\['cpu'\]` is inf"),
    ({"resources_per_trial": {"gpu": -INF}}, ValueError, r"`resources_per_trial\['gpu'\]` is -inf"),
    (
        {"resources_per_trial": {"gpu": True}},
        TypeError,
        r"`resources_per_trial\['gpu'\]` is True, but must be a number >= 0",
    ),
    ({"resources_per_trial": {"cpu": "2"}}, TypeError, r"`resources_per_trial\['cpu'\]` is '2'"),
    (
        {"resources_per_trial": {1: 1}},
        TypeError,
        r"`resources_per_trial` has the key 1, but its keys must be resource names",
    ),
    ({"resources_per_trial": {"": 1}}, TypeError, r"`resources_per_trial` has the key ''"),
    # param_space: params.json and a resume keep string keys only, at any depth
    (
        {"param_space": {1: 2, "a": 1.0}},
        TypeError,
        r"`param_space` has the key 1 \(int\), but every key in `param_space` must be a string",
    ),
    ({"param_space": {"a": 1, "net": {2: 3}}}, TypeError, r"`param_space\['net'\]` has the key 2"),
    (
        {"param_space": {"a": 1, "layers": [{"w": 1}, {None: 2}]}},
        TypeError,
        r"`param_space\['layers'\]\[1\]` has the key None \(NoneType\)",
    ),
    (
        {"param_space": {"a": 1, "opt": choice([{"lr": 1}, {(1, 2): 3}])}},
        TypeError,
        r"`param_space\['opt'\]\.categories\[1\]` has the key \(1, 2\) \(tuple\)",
    ),
    (
        {"param_space": {"a": grid_search([1, {2.5: 1}])}},
        TypeError,
        r"`param_space\['a'\]\['grid_search'\]\[1\]` has the key 2\.5 \(float\)",
    ),
    # name: a plain folder name that reads the same everywhere
    ({"name": "n" * 300}, ValueError, r"is 300 bytes in UTF-8, but a part may have at most 240"),
    ({"name": "é" * 121}, ValueError, r"is 242 bytes in UTF-8, but a part may have at most 240"),
    ({"name": "a\nb"}, ValueError, r"`name` is 'a\\nb', but must not hold control .*U\+000A"),
    ({"name": "a\u202eb"}, ValueError, r"U\+202E RIGHT-TO-LEFT OVERRIDE at index 1"),
    ({"name": "a\x00b"}, ValueError, r"`name` is 'a\\x00b', but must not hold control"),
    ({"name": "a\tb"}, ValueError, r"U\+0009 at index 1"),
    ({"name": "a\x1b[31mb"}, ValueError, r"U\+001B at index 1"),
    ({"name": "a\u200bb"}, ValueError, r"U\+200B ZERO WIDTH SPACE"),
    ({"name": "a\u2028b"}, ValueError, r"U\+2028 LINE SEPARATOR"),
    ({"name": "a\u2066b"}, ValueError, r"U\+2066 LEFT-TO-RIGHT ISOLATE"),
    ({"name": "a\ud800b"}, ValueError, r"U\+D800 at index 1"),  # no UTF-8 for it
    ({"name": "exp."}, ValueError, r"its part 'exp\.' must not end with '\.'"),
    ({"name": "exp/run..."}, ValueError, r"its part 'run\.\.\.' must not end with '\.'"),
    ({"name": "exp "}, ValueError, r"its part 'exp ' must not begin or end with a space"),
    ({"name": " exp"}, ValueError, r"its part ' exp' must not begin or end with a space"),
    ({"name": "exp/\u3000"}, ValueError, r"its part '\\u3000' must not begin or end with a space"),
    ({"name": ".hidden"}, ValueError, r"its part '\.hidden' must not start with '\.'"),
    ({"name": "other/.popflow"}, ValueError, r"its part '\.popflow' must not start with '\.'"),
    # the rest, with NaN, infinity and bools where they do not belong
    ({"commit_interval": INF}, ValueError, r"`commit_interval` is inf, but must be finite"),
    ({"commit_interval": NAN}, ValueError, r"`commit_interval` is nan, but must be > 0"),
    ({"log_flush_interval": NAN}, ValueError, r"`log_flush_interval` is nan, but must be >= 0"),
    ({"segment_timeout_s": NAN}, ValueError, r"`segment_timeout_s` is nan, but must be > 0"),
    ({"time_budget_s": NAN}, ValueError, r"`time_budget_s` is nan, but must be > 0"),
    ({"time_budget_s": -INF}, ValueError, r"`time_budget_s` is -inf, but must be > 0"),
    ({"lease_ttl": NAN}, ValueError, r"`lease_ttl` is nan, but must be > 0"),
    ({"max_rounds": True}, ValueError, r"`max_rounds` is True, but must be an int >= 1"),
    ({"max_concurrent_trials": True}, ValueError, r"`max_concurrent_trials` is True"),
    ({"seed": True}, TypeError, r"`seed` is True, but must be an int >= 0"),
    ({"n_workers": True}, TypeError, r"`n_workers` is True, but must be an int >= 1"),
    ({"max_failures": True}, ValueError, r"`max_failures` is True"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), REFUSED)
def test_run_refuses_before_anything_starts_or_is_written(
    tmp_path: Path, nothing_starts: None, kwargs: dict[str, Any], error: type, message: str
) -> None:
    storage = tmp_path / "results"
    args: dict[str, Any] = {"storage": str(storage), "name": "exp", "seed": 0, **kwargs}
    param_space = args.pop("param_space", {"a": 1})
    with pytest.raises(error, match=message):
        run(ParityTrainable, param_space, **args)
    assert_nothing_in(storage)


#: CheckpointConfig's counts are ints: NaN, True or 2.5 as a frequency would checkpoint
#: never, always, or at no iteration at all.
CHECKPOINT_CONFIGS: list[tuple[dict[str, Any], type[Exception], str]] = [
    (
        {"checkpoint_frequency": NAN},
        TypeError,
        r"`checkpoint_frequency` is nan, but must be an int >= 0",
    ),
    ({"checkpoint_frequency": INF}, TypeError, r"`checkpoint_frequency` is inf"),
    ({"checkpoint_frequency": 2.5}, TypeError, r"`checkpoint_frequency` is 2\.5"),
    ({"checkpoint_frequency": True}, TypeError, r"`checkpoint_frequency` is True"),
    ({"checkpoint_frequency": "3"}, TypeError, r"`checkpoint_frequency` is '3'"),
    ({"checkpoint_frequency": -1}, ValueError, r"`checkpoint_frequency` is -1, but must be >= 0"),
    ({"num_to_keep": NAN}, TypeError, r"`num_to_keep` is nan, but must be an int >= 1 or None"),
    ({"num_to_keep": True}, TypeError, r"`num_to_keep` is True"),
    ({"num_to_keep": 0}, ValueError, r"`num_to_keep` is 0, but must be >= 1 or None"),
    ({"checkpoint_score_attribute": 3}, TypeError, r"`checkpoint_score_attribute` is 3"),
    ({"checkpoint_at_end": "yes"}, TypeError, r"`checkpoint_at_end` is 'yes', but must be True"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), CHECKPOINT_CONFIGS)
def test_checkpoint_config_refuses_what_no_checkpoint_schedule_means(kwargs, error, message):
    with pytest.raises(error, match=message):
        CheckpointConfig(**kwargs)


def test_a_name_too_long_for_an_object_key_is_refused(nothing_starts: None) -> None:
    """An S3 key holds 1024 bytes: the experiment's folder may take 512, the rest is kept
    for its trial folders and checkpoints. Checked before the store is asked anything."""
    prefix = "p" * 300
    with pytest.raises(
        ValueError,
        match=r"the experiment's folder would be an object key of 531 bytes, but may have "
        r"at most 512 \(an object key holds 1024",
    ):
        run(
            ParityTrainable,
            {"a": 1},
            storage=f"s3://no-such-bucket-is-asked/{prefix}",
            storage_options={"key": "k", "secret": "s"},
            name="n" * 230,
        )


def test_a_name_too_long_for_a_local_path_is_refused(tmp_path: Path, nothing_starts) -> None:
    storage = tmp_path.joinpath(*["d" * 200] * 18)  # 3,600 bytes and more: not made
    with pytest.raises(
        ValueError, match=r"would be a local path of \d+ bytes, but may have at most 3584"
    ):
        run(ParityTrainable, {"a": 1}, storage=str(storage), name="exp")
    assert not (tmp_path / ("d" * 200)).exists()


# -- Ray's doors: tune.run and Tuner -------------------------------------------------


def fit_tuner(storage: Path, **over: Any) -> Any:
    run_config = RunConfig(
        name=over.pop("name", "exp"), storage_path=str(storage), stop=over.pop("stop", None)
    )
    return Tuner(
        parity_function,
        param_space=over.pop("param_space", {"a": 1}),
        tune_config=TuneConfig(seed=0),
        run_config=run_config,
    ).fit()


RAY_DOORS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("tune.run", {"config": {1: 2, "a": 1.0}}, TypeError, r"`param_space` has the key 1"),
    ("tune.run", {"stop": {"training_iteration": NAN}}, ValueError, r"`stop\['training_iter"),
    ("tune.run", {"name": "n" * 300}, ValueError, r"is 300 bytes in UTF-8"),
    ("tune.run", {"name": "a\u202eb"}, ValueError, r"U\+202E RIGHT-TO-LEFT OVERRIDE"),
    ("tune.run", {"resources_per_trial": {"cpu": NAN}}, ValueError, r"`resources\['cpu'\]` is nan"),
    ("tune.run", {"checkpoint_freq": NAN}, TypeError, r"`checkpoint_frequency` is nan"),
    ("tune.run", {"checkpoint_freq": -2}, ValueError, r"`checkpoint_frequency` is -2"),
    ("tune.run", {"keep_checkpoints_num": True}, TypeError, r"`num_to_keep` is True"),
    ("tune.run", {"checkpoint_score_attr": 3}, TypeError, r"`checkpoint_score_attr` is 3"),
    ("Tuner", {"param_space": {"a": {1: 2}}}, TypeError, r"`param_space\['a'\]` has the key 1"),
    ("Tuner", {"stop": {"score": NAN}}, ValueError, r"`stop\['score'\]` is nan"),
    ("Tuner", {"name": "a\nb"}, ValueError, r"`name` is 'a\\nb', but must not hold control"),
    ("Tuner", {"name": "exp."}, ValueError, r"must not end with '\.'"),
]


@pytest.mark.filterwarnings("ignore:.*passed to tune.run are deprecated:DeprecationWarning")
@pytest.mark.parametrize(("door", "kwargs", "error", "message"), RAY_DOORS)
def test_rays_doors_refuse_before_anything_starts_or_is_written(
    tmp_path: Path, nothing_starts: None, door: str, kwargs: dict[str, Any], error, message
) -> None:
    storage = tmp_path / "results"
    with pytest.raises(error, match=message):
        if door == "Tuner":
            fit_tuner(storage, **kwargs)
        else:
            tune.run(ParityTrainable, storage_path=str(storage), **{"config": {"a": 1}, **kwargs})
    assert_nothing_in(storage)


def test_with_resources_refuses_at_once() -> None:
    with pytest.raises(ValueError, match=r"`resources\['gpu'\]` is inf, but must be a number >= 0"):
        tune.with_resources(parity_function, {"gpu": INF})


# -- properties ------------------------------------------------------------------------

REFUSED_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
invisible = st.characters(categories=REFUSED_CATEGORIES)
plain = st.text(st.characters(categories=("L", "N"), include_characters="-_"), min_size=1)


@settings(max_examples=examples(200), deadline=None)
@given(before=plain, bad=invisible, after=plain)
def test_any_name_with_a_control_or_invisible_character_is_refused(before, bad, after) -> None:
    name = before + bad + after
    with pytest.raises(ValueError, match=rf"must not hold control .*U\+{ord(bad):04X}"):
        check_name(name)


@settings(max_examples=examples(200), deadline=None)
@given(name=st.text(max_size=300))
def test_a_name_is_refused_or_a_plain_relative_folder(name: str) -> None:
    """Whatever the string: refused with a ValueError/TypeError naming `name`, or a path
    of plain parts that encodes to UTF-8 and fits a folder name."""
    try:
        check_name(name)
    except (ValueError, TypeError) as e:
        assert str(e).startswith("`name` is ")
        return
    for part in name.split("/"):
        assert part and part == part.strip() and part[0] != "." and part[-1] != "."
        assert len(part.encode("utf-8")) <= MAX_NAME_PART_BYTES
        assert not any(unicodedata.category(c) in REFUSED_CATEGORIES for c in part)


json_keys = st.one_of(st.integers(), st.floats(allow_nan=False), st.none(), st.booleans())
nested = st.recursive(
    st.one_of(st.integers(), st.text(max_size=3)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=3), json_keys), inner, max_size=3),
    ),
    max_leaves=8,
)


@settings(max_examples=examples(100), deadline=None)
@given(space=st.dictionaries(st.text(min_size=1, max_size=3), nested, max_size=3), name=st.text())
def test_any_refused_input_writes_nothing(tmp_path_factory, space, name) -> None:
    """A param_space with any key that is not a string, or any name, never gets as far as
    starting something: it is refused (writing nothing) or it passes every check."""
    storage = tmp_path_factory.mktemp("refused") / "results"
    with pytest.MonkeyPatch.context() as patch:
        for started in ("ClusterStart", "PrefectRecord", "train"):
            patch.setattr(launch, started, _stop_here)
        try:
            run(ParityTrainable, space, storage=str(storage), name=name, seed=0)
        except (ValueError, TypeError):
            assert_nothing_in(storage)
            return
        except _Passed:
            pass
    assert not _has_other_keys(space)


class _Passed(Exception):
    """Every check passed: ``run`` went on to start the cluster."""


def _stop_here(*args: Any, **kwargs: Any) -> Any:
    raise _Passed


def _has_other_keys(value: Any) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _has_other_keys(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_other_keys(v) for v in value)
    return False

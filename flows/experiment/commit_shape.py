"""What a commit's state and ``experiment.json`` must look like for a reader to use them.

A commit's SHA-256 (:mod:`popflow.infra.store.commit_log`) catches a torn or edited
file, not one written whole with the wrong shape (a forged commit, a file from
another tool, a bug): valid JSON, right checksum, a trial without ``status``.
Readers (``popflow status``/``show``/``resume``, ``ResultGrid.from_path``, the
plots) check the shape here first, so such a file is one message naming it
rather than a ``KeyError`` deep inside. The trial fields are those of
:meth:`popflow.flows.experiment.trial_table.TrialRecord.state`.

>>> problem_of_info({"name": "exp", "seed": "zero"})
"'seed' is 'zero', but must be an int >= 0 or null"
>>> problem_of_commit({"round": 1, "trials": [{}], "scheduler": {}, "derived": {}})
"trials[0] has no 'trial_id'"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from popflow.flows.experiment.commit_paths import check_commit_paths
from popflow.schedulers import TrialStatus
from popflow.schedulers.validation import is_int, is_real

Rule = tuple[Callable[[Any], bool], str]


class MalformedExperiment(ValueError):
    """A file of the experiment's log is valid as far as its checksum goes, but not what
    popflow writes there (garbled ``experiment.json``, a commit of the wrong shape)."""

    def __init__(self, url: str, problem: str) -> None:
        super().__init__(f"{url} is not what popflow writes there: {problem}; nothing was changed")
        self.url = url


def check_commit(commit: Mapping[str, Any], commit_url: str, experiment_url: str) -> None:
    """A commit read from storage (at ``commit_url``) before anything acts on it: its
    shape (:class:`MalformedExperiment`), then the paths it names
    (:class:`~popflow.infra.storage.safe_paths.UnsafePath`, :mod:`popflow.flows.experiment.commit_paths`)."""
    problem = problem_of_commit(commit)
    if problem:
        raise MalformedExperiment(commit_url, problem)
    check_commit_paths(commit, experiment_url)


def _count(v: Any) -> bool:
    return is_int(v) and v >= 0


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _str_or_none(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _object(v: Any) -> bool:
    return isinstance(v, Mapping) and all(isinstance(k, str) for k in v)


def _list(v: Any) -> bool:
    return isinstance(v, list)


def _start(v: Any) -> bool:
    """A trial's lineage start (``TrialRecord.start``)."""
    return (
        _object(v)
        and set(v) == {"restore", "iteration", "results", "exploit"}
        and _str(v["restore"])
        and _count(v["iteration"])
        and (v["results"] is None or _count(v["results"]))
        and _count(v["exploit"])
    )


def _rebuild(v: Any) -> bool:
    """A pending rebuild of the state a trial's exploit cloned (``TrialRecord.rebuild``)."""
    return (
        _object(v)
        and set(v)
        == {"source", "lineage", "through", "config", "index", "generation", "restore", "iteration"}
        and _str(v["source"])
        and (v["lineage"] is None or _count(v["lineage"]))
        and _count(v["through"])
        and _object(v["config"])
        and _count(v["index"])
        and _count(v["generation"])
        and _str_or_none(v["restore"])
        and _count(v["iteration"])
        and v["iteration"] < v["through"]
    )


COUNT: Rule = (_count, "an int >= 0")
TEXT: Rule = (_str, "a string")
TEXT_OR_NULL: Rule = (_str_or_none, "a string or null")
OBJECT: Rule = (_object, "an object")
LIST: Rule = (_list, "a list")

_STATUSES = frozenset(s.value for s in TrialStatus)

#: A committed trial's fields (TrialRecord.state()); trainable_name and name are
#: optional: older commits lack them.
TRIAL_FIELDS: dict[str, Rule] = {
    "trial_id": TEXT,
    "index": COUNT,
    "dirname": TEXT,
    "config": OBJECT,
    "status": (lambda v: v in _STATUSES, f"one of {', '.join(sorted(_STATUSES))}"),
    "experiment_tag": TEXT,
    "last_train_time": (is_real, "a number"),
    "num_results": COUNT,
    "restore": TEXT_OR_NULL,
    "restore_iteration": COUNT,
    "checkpoints": LIST,
    "num_failures": COUNT,
    "error": TEXT_OR_NULL,
    "lineage": LIST,
    "generation": COUNT,
    "csv_header": (lambda v: v is None or (_list(v) and all(map(_str, v))), "strings or null"),
}
_COUNT_OR_NULL: Rule = (lambda v: v is None or _count(v), "an int >= 0 or null")
#: older commits lack these
OPTIONAL_TRIAL_FIELDS: dict[str, Rule] = {
    "trainable_name": TEXT,
    "name": TEXT_OR_NULL,
    "restore_results": _COUNT_OR_NULL,
    "replay_through": COUNT,
    "start": (
        lambda v: v is None or _start(v),
        "null or an object of restore, iteration, results, exploit",
    ),
    "rebuild": (
        lambda v: v is None or _rebuild(v),
        "null or an object of source, lineage, through, config, index, generation, restore, "
        "iteration (before through)",
    ),
    "first_config": (lambda v: v is None or _object(v), "null or an object"),
}
CHECKPOINT_FIELDS: dict[str, Rule] = {"name": TEXT, "iteration": COUNT, "result": OBJECT}
_SHA256_OR_NULL: Rule = (
    lambda v: v is None or (_str(v) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)),
    "a SHA-256 in hex or null",
)
OPTIONAL_CHECKPOINT_FIELDS: dict[str, Rule] = {
    "results": _COUNT_OR_NULL,
    "digest": _SHA256_OR_NULL,
    "exploit": _COUNT_OR_NULL,
}

#: ``experiment.json``'s fields, each optional (a reader falls back on the commit's).
INFO_FIELDS: dict[str, Rule] = {
    "name": TEXT_OR_NULL,
    "scheduler": TEXT,
    "seed": (lambda v: v is None or _count(v), "an int >= 0 or null"),
    "metric": TEXT_OR_NULL,
    "mode": (lambda v: v in (None, "min", "max"), "'min', 'max' or null"),
    "trainable": TEXT,
    "num_trials": COUNT,
    "created": (is_real, "a number"),
}


def _field_problem(where: str, record: Mapping[str, Any], fields: dict[str, Rule]) -> str | None:
    """The first field of ``record`` (at ``where``; "": the top) missing or breaking its rule."""
    for key, (ok, rule) in fields.items():
        if key not in record:
            return f"{where or 'it'} has no {key!r}"
        if not ok(record[key]):
            field = f"{where}[{key!r}]" if where else repr(key)
            return f"{field} is {_short(record[key])}, but must be {rule}"
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _optional_problem(where: str, record: Mapping[str, Any], fields: dict[str, Rule]) -> str | None:
    present = {k: rule for k, rule in fields.items() if k in record}
    return _field_problem(where, record, present)


def problem_of_info(info: Any) -> str | None:
    """What is wrong with ``experiment.json``'s parsed content (None: nothing)."""
    if not isinstance(info, dict):
        return f"it holds a JSON {type(info).__name__}, not an object"
    return _optional_problem("", info, INFO_FIELDS)


def _trial_problem(i: int, trial: Any) -> str | None:
    where = f"trials[{i}]"
    if not isinstance(trial, dict):
        return f"{where} is {_short(trial)}, but must be an object"
    problem = _field_problem(where, trial, TRIAL_FIELDS) or _optional_problem(
        where, trial, OPTIONAL_TRIAL_FIELDS
    )
    if problem:
        return problem
    for j, checkpoint in enumerate(trial["checkpoints"]):
        at = f"{where}['checkpoints'][{j}]"
        known = CHECKPOINT_FIELDS.keys() | OPTIONAL_CHECKPOINT_FIELDS.keys()
        if (
            not isinstance(checkpoint, dict)
            or not CHECKPOINT_FIELDS.keys() <= set(checkpoint) <= known
        ):
            return f"{at} is {_short(checkpoint)}, but must be an object of {sorted(known)}"
        problem = _field_problem(at, checkpoint, CHECKPOINT_FIELDS) or _optional_problem(
            at, checkpoint, OPTIONAL_CHECKPOINT_FIELDS
        )
        if problem:
            return problem
    return None


def problem_of_commit(commit: Mapping[str, Any]) -> str | None:
    """What is wrong with a commit's shape, as :meth:`ExperimentLog.read` returns it (its
    round's fields and the state it leaves); None: nothing a reader would trip on."""
    problem = _field_problem(
        "",
        commit,
        {
            "round": COUNT,
            "trials": LIST,
            "scheduler": OBJECT,
            "derived": (lambda v: _object(v) and all(map(_count, v.values())), "sizes by path"),
        },
    ) or _optional_problem("", commit, {"policy_total": COUNT})
    if problem:
        return problem
    for i, trial in enumerate(commit["trials"]):
        problem = _trial_problem(i, trial)
        if problem:
            return problem
    return None

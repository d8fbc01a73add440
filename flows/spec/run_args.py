"""A run's arguments, kept for ``popflow resume`` and ``Tuner.restore``: data where they can be.

``.popflow/run_args.json`` holds them as JSON (:mod:`popflow.flows.spec.args_codec`):
plain values, the trainable and functions by import path, the scheduler by class
and constructor arguments, search spaces by name and fields, a
``with_parameters`` trainable by what it wraps and its stored objects' paths.
Only what JSON cannot say (a lambda or closure in ``param_space`` or a
scheduler, a trainable defined in ``__main__``, callbacks, objects of the user's
own) is pickled, into ``.popflow/run_args.pkl``, whose SHA-256 the JSON records;
saving says which arguments went there (a warning on an object store, where more
people may write the bucket than the code). Experiments written before keep
everything in ``.popflow/tune_args.pkl``, still read when there is no JSON.

Storage is trusted as code is: whoever can write these files can make a resume
import modules and call functions they name, and unpickle ``run_args.pkl`` (or
the old ``tune_args.pkl``), which runs any code. See docs/how-to/s3-credentials.md ("Who can run
code through storage"). What cannot be read back as arguments (garbled, or of a shape
popflow never writes) is :class:`BadRunArgs`, one line from ``popflow resume``.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import cloudpickle

from popflow.flows.spec.args_codec import ArgsDecodeError, Decoder, Encoder, ImportFailed
from popflow.flows.spec.config import CheckpointConfig
from popflow.flows.spec.run_spec import RUN_ARGUMENTS
from popflow.flows.spec.trainable_paths import check_trainable, path_of
from popflow.infra.jsonutil import dumps
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import (
    CODE_FILE,
    OLD_RUN_ARGS_FILE,
    PICKLED_ARGS_FILE,
    RUN_ARGS_FILE,
)
from popflow.schedulers import TrialScheduler
from popflow.tasks.trainable import trainable_name

logger = logging.getLogger(__name__)

FORMAT = 1


class BadRunArgs(ArgsDecodeError):
    """The stored run arguments cannot be read back (garbled, or a shape popflow never
    writes); nothing was run."""


class CodeNotFound(RuntimeError):
    """``popflow resume`` cannot import the experiment's trainable here."""


def save_run_args(storage: Storage, args: dict[str, Any]) -> None:
    """Keep what ``popflow resume`` needs to call ``run`` again (trainable, scheduler, ...).

    Best effort: arguments that cannot be pickled (a generator in a closure,
    say) only cost the command line; ``run(..., resume=True)`` still works.
    """
    encoder = Encoder()
    encoded = {k: encoder.encode(v, k) for k, v in args.items()}
    record: dict[str, Any] = {"format": FORMAT, "args": encoded}
    if encoder.leaves:
        try:
            data = cloudpickle.dumps(encoder.leaves)
        except Exception as e:
            if not args.get("callbacks"):
                logger.warning("`popflow resume` will not work for this experiment: %s", e)
                return
            logger.warning("its callbacks cannot be pickled (%s); a resume runs without them", e)
            save_run_args(storage, {**args, "callbacks": None})
            return
        record.update(pickled=encoder.where, pickled_sha256=hashlib.sha256(data).hexdigest())
        storage.write_bytes(data, PICKLED_ARGS_FILE)
        _say_pickled(storage, encoder.where)
    storage.write_text(dumps(record, indent=1), RUN_ARGS_FILE)


def _say_pickled(storage: Storage, where: list[str]) -> None:
    level = logging.INFO if storage.is_local else logging.WARNING
    logger.log(
        level,
        "%s kept as a pickle: whoever can write this storage can run code where it is "
        "resumed (docs/how-to/s3-credentials.md)",
        ", ".join(where),
    )


def load_run_args(storage: Storage) -> dict[str, Any]:
    """The arguments :func:`save_run_args` kept (FileNotFoundError: none were).

    The trainable is found as the run found it: if its module does not import
    here, the folders it was loaded from (:data:`CODE_FILE`) are tried; then
    :class:`CodeNotFound` says what to put on ``PYTHONPATH``. :class:`BadRunArgs`
    if they are garbled or not of popflow's shape.
    """
    try:
        text = storage.read_text(RUN_ARGS_FILE)
    except FileNotFoundError:
        data = storage.read_bytes(OLD_RUN_ARGS_FILE)  # FileNotFoundError: none kept at all
        old = _found(storage, lambda: _unpickle(storage, data, OLD_RUN_ARGS_FILE))
        return _checked(storage, OLD_RUN_ARGS_FILE, old)
    try:
        record = json.loads(text)
    except ValueError as e:
        raise _bad(storage, RUN_ARGS_FILE, f"not JSON ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise _bad(storage, RUN_ARGS_FILE, f"not popflow's format {FORMAT}")
    if not isinstance(record.get("args"), dict):
        raise _bad(storage, RUN_ARGS_FILE, "it holds no arguments")
    leaves: list[Any] | None = None

    def pickled() -> list[Any]:
        nonlocal leaves
        if leaves is None:
            leaves = _leaves(storage, record.get("pickled_sha256"))
        return leaves

    def decode() -> dict[str, Any]:
        decoder = Decoder(pickled)
        try:
            return {k: decoder.decode(v, k) for k, v in record["args"].items()}
        except BadRunArgs:  # the pickle it names
            raise
        except ArgsDecodeError as e:
            raise _bad(storage, RUN_ARGS_FILE, str(e)) from None

    return _checked(storage, RUN_ARGS_FILE, _found(storage, decode))


def _leaves(storage: Storage, digest: Any) -> list[Any]:
    try:
        data = storage.read_bytes(PICKLED_ARGS_FILE)
    except FileNotFoundError:
        raise _bad(storage, PICKLED_ARGS_FILE, "it is missing") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise _bad(
            storage, PICKLED_ARGS_FILE, f"its SHA-256 is not the one {RUN_ARGS_FILE} records"
        )
    leaves = _unpickle(storage, data, PICKLED_ARGS_FILE)
    if not isinstance(leaves, list):
        raise _bad(storage, PICKLED_ARGS_FILE, f"it holds a {type(leaves).__name__}, not a list")
    return leaves


def _unpickle(storage: Storage, data: bytes, name: str) -> Any:
    try:
        return cloudpickle.loads(data)
    except (ModuleNotFoundError, AttributeError) as e:  # code missing here: maybe on a path
        raise ImportFailed(name, e) from e
    except Exception as e:  # a garbled pickle raises anything at all
        raise _bad(storage, name, f"it does not unpickle ({type(e).__name__}: {e})") from None


def _found(storage: Storage, load: Callable[[], Any]) -> Any:
    """``load()``; if what it names does not import, again with the folders the run
    found its trainable in (:data:`CODE_FILE`) on ``sys.path``."""
    try:
        return load()
    except ImportFailed as first:
        try:
            code = json.loads(storage.read_text(CODE_FILE))
        except FileNotFoundError:
            raise CodeNotFound(f"cannot load the run's trainable: {first.error}") from first
        except ValueError:
            raise _bad(storage, CODE_FILE, "not JSON") from None
        if not isinstance(code, dict):
            raise _bad(storage, CODE_FILE, "not popflow's shape") from None
        folders = [d for d in (code.get("module_dir"), code.get("cwd")) if isinstance(d, str) and d]
        for folder in folders:
            if folder not in sys.path:
                sys.path.insert(0, folder)
        try:
            return load()
        except ImportFailed as e:
            raise CodeNotFound(
                f"cannot load the trainable {code.get('trainable')!r} ({e.error}); it was loaded "
                f"from {code.get('module_file')!r}: add {' or '.join(map(repr, folders))} to "
                "PYTHONPATH (or run from there)"
            ) from e


def _checked(storage: Storage, where: str, args: Any) -> dict[str, Any]:
    """``args`` (read from ``where``) if they have the shape ``run`` takes; else
    :class:`BadRunArgs`. A trainable that is a function or a class must be a trainable
    (:func:`~popflow.flows.spec.trainable_paths.check_trainable`): JSON can name any."""
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise _bad(storage, where, f"it holds a {type(args).__name__}, not run()'s arguments")
    unknown = sorted(set(args) - set(RUN_ARGUMENTS))  # run()'s, less storage_options
    if unknown or "trainable" not in args:
        raise _bad(storage, where, f"no trainable, or arguments run() does not take: {unknown}")
    trainable = args["trainable"]
    try:
        if inspect.isfunction(trainable) or inspect.isclass(trainable):
            check_trainable(trainable, path_of(trainable) or trainable_name(trainable))
        elif not callable(trainable):
            raise ValueError(f"`trainable` is {type(trainable).__name__}, not callable")
    except ValueError as e:
        raise _bad(storage, where, str(e)) from None
    for key, kind in (
        ("scheduler", TrialScheduler),
        ("param_space", dict),
        ("checkpoint_config", CheckpointConfig),
        ("callbacks", list),
    ):
        if args.get(key) is not None and not isinstance(args[key], kind):
            raise _bad(storage, where, f"`{key}` is a {type(args[key]).__name__}")
    return args


def _bad(storage: Storage, name: str, why: str) -> BadRunArgs:
    return BadRunArgs(
        f"{storage.full_url(name)} cannot be read back as the run's arguments: {why}; "
        "resume it from Python instead: run(<the same arguments>, resume=True)"
    )


def save_code_origin(storage: Storage, trainable: Any) -> None:
    """Record the trainable's import path, file and the run's working directory."""
    module = sys.modules.get(getattr(trainable, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    origin = {
        "trainable": f"{getattr(trainable, '__module__', '?')}:"
        f"{getattr(trainable, '__qualname__', trainable_name(trainable))}",
        "module_file": path,
        "module_dir": os.path.dirname(os.path.abspath(path)) if path else None,
        "cwd": os.getcwd(),
    }
    storage.write_text(dumps(origin, indent=2), CODE_FILE)

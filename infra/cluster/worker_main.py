"""Dask worker processes that do without the user's ``__main__``: a script with no
``if __name__ == "__main__":`` guard must not start tune again in every worker the
embedded cluster spawns (:mod:`popflow.infra.cluster.dask_cluster`)."""

from __future__ import annotations

import functools
import importlib.util
import threading
import tokenize
from collections.abc import Callable, Iterator, Mapping
from multiprocessing import spawn
from typing import Any

#: The name distributed's nanny gives the worker processes it starts
#: (``distributed.nanny.WorkerProcess.start``), first start and restarts alike.
WORKER_PROCESS_NAME = "Dask Worker process (from Nanny)"


def worker_preparation_data(
    get_preparation_data: Callable[[str], dict[str, Any]], name: str
) -> dict[str, Any]:
    """multiprocessing's preparation data for a child named ``name``, less the user's
    ``__main__`` if the child is a Dask worker process.

    A spawned or forkserver child runs the parent's main script again (as
    ``__mp_main__``) to unpickle what came from it. A script without
    ``if __name__ == "__main__":`` would start tune again in every worker, so
    (:func:`main_is_guarded`) its workers do without it: popflow's trainables
    travel by cloudpickle, ``__main__``'s functions and classes by value.
    ``sys_path`` and ``dir`` stay: the user's own modules next to the script
    still import.
    """
    data = get_preparation_data(name)
    if name == WORKER_PROCESS_NAME and not main_is_guarded(_main_path(data)):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)  # `python -m package.script`
    return data


def _main_path(data: Mapping[str, Any]) -> str | None:
    if "init_main_from_path" in data:
        return str(data["init_main_from_path"])
    if "init_main_from_name" in data:
        try:
            spec = importlib.util.find_spec(str(data["init_main_from_name"]))
        except (ImportError, ValueError):
            return None
        return spec.origin if spec is not None else None
    return None


def main_is_guarded(path: str | None) -> bool:
    """Whether the script at ``path`` runs its work under ``if __name__ == "__main__":``.

    A guarded script is safe for a worker to run again as ``__mp_main__`` (the
    objects its functions refer to by name, a ``functools.cache``'d function say, is
    found there). One without the guard would start tune again in every worker, so
    its workers do without it. Read with :mod:`tokenize`, not :func:`ast.parse`:
    CPython 3.11's AST conversion is not thread-safe ("AST constructor recursion depth
    mismatch", gh-106905, also when another thread parses: 3.11's tracebacks do), and
    the embedded cluster's workers start in threads at once.
    """
    return _main_is_guarded(path)


#: ``__name__ == "__main__"`` as tokens, either way round
_GUARDS = {
    ("__name__", "==", "'__main__'"),
    ("__name__", "==", '"__main__"'),
    ("'__main__'", "==", "__name__"),
    ('"__main__"', "==", "__name__"),
}


@functools.lru_cache(maxsize=16)
def _main_is_guarded(path: str | None) -> bool:
    if path is None:
        return False
    try:
        with open(path, "rb") as f:
            return any(tuple(test) in _GUARDS for test in _top_level_if_tests(f.readline))
    except (OSError, SyntaxError, ValueError, tokenize.TokenError):
        return False


def _top_level_if_tests(readline: Callable[[], bytes]) -> Iterator[list[str]]:
    """The tests of the module's top-level ``if`` statements, each as its tokens' strings
    (brackets, comments and line breaks left out)."""
    indent = brackets = 0
    line_start = True
    test: list[str] | None = None
    for tok in tokenize.tokenize(readline):
        kind, text = tok.type, tok.string
        if kind == tokenize.INDENT:
            indent += 1
        elif kind == tokenize.DEDENT:
            indent -= 1
        elif kind == tokenize.OP and text in "([{":
            brackets += 1
        elif kind == tokenize.OP and text in ")]}":
            brackets -= 1
        elif test is not None and kind == tokenize.OP and text == ":" and brackets == 0:
            yield test
            test = None
        elif test is not None and kind not in _SKIPPED:
            test.append(text)
        elif line_start and indent == 0 and kind == tokenize.NAME and text == "if":
            test = []
        line_start = kind in (tokenize.NEWLINE, tokenize.ENCODING) or (
            line_start and kind in _SKIPPED
        )


_SKIPPED = {tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT}


class _WorkersWithoutMain:
    """Keeps ``multiprocessing.spawn.get_preparation_data`` wrapped by
    :func:`worker_preparation_data` while any embedded cluster is open in this
    process (its nanny may restart a worker at any time), and restores it when
    the last one closes.

    multiprocessing offers no per-process hook: both the spawn and the forkserver
    start methods call this module function by name with the child's process
    name, in the parent, so the wrapper recognises Dask's worker processes by
    that name and leaves every other child alone. Another LocalCluster's workers
    started in this process meanwhile lose ``__main__`` too; Dask pickles
    ``__main__``'s objects by value, so they need it no more than ours.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # clusters start and close on several threads
        self._users = 0
        self._original: Callable[[str], dict[str, Any]] | None = None
        self._wrapper: Callable[[str], dict[str, Any]] | None = None

    def acquire(self) -> None:
        with self._lock:
            if self._users == 0:
                self._original = spawn.get_preparation_data
                # the original bound in, so a spawn racing the last close still works
                self._wrapper = functools.partial(self._preparation_data, self._original)
                spawn.get_preparation_data = self._wrapper
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users:
                return
            # someone wrapped it after us: leave theirs (ours inside it passes through)
            if spawn.get_preparation_data is self._wrapper:
                spawn.get_preparation_data = self._original
            self._original = self._wrapper = None

    def _preparation_data(
        self, original: Callable[[str], dict[str, Any]], name: str
    ) -> dict[str, Any]:
        if self._users:  # else inert: the last embedded cluster closed under another's wrap
            return worker_preparation_data(original, name)
        return original(name)


#: The one wrapper of this process: the embedded cluster acquires it while open.
WITHOUT_MAIN = _WorkersWithoutMain()

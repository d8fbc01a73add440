"""The user's Prefect settings, as the suite must leave them: their Prefect homes (what is
in them, links followed) and the files Prefect reads settings from in a working folder."""

from __future__ import annotations

import contextlib
import os
import stat
import tomllib
from pathlib import Path

from dotenv import dotenv_values

#: What a snapshot holds for one path: a file's (size, mtime_ns, link target or None), or
#: ("folder", link target or None), or ("dangling", link target).
Entry = tuple[object, ...]


def user_homes(environ: dict[str, str]) -> list[Path]:
    """The user's Prefect homes: ``~/.prefect``, and ``PREFECT_HOME`` if they set another.
    Both are watched: a script that loses ``PREFECT_HOME`` falls back to the first."""
    homes = [Path.home() / ".prefect"]
    if environ.get("PREFECT_HOME"):
        homes.append(Path(environ["PREFECT_HOME"]).expanduser())
    out: list[Path] = []
    for home in homes:
        if all(os.path.realpath(home) != os.path.realpath(h) for h in out):
            out.append(home)
    return out


def snapshot(folder: Path) -> dict[str, Entry] | None:
    """Every file and folder under ``folder``: a file's size and modification time, a
    link's target and what it leads to (a link into a database elsewhere is followed, so
    writing through it is a change); ``None`` if ``folder`` does not exist."""
    if not os.path.lexists(folder):
        return None
    out: dict[str, Entry] = {}
    seen: set[tuple[int, int]] = set()

    def walk(path: str, rel: str) -> None:
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in seen:  # a link back up: listed once
                return
            seen.add((st.st_dev, st.st_ino))
            entries = list(os.scandir(path))
        except OSError:  # gone, or not readable
            return
        for entry in entries:
            name = os.path.join(rel, entry.name) if rel else entry.name
            target = None
            with contextlib.suppress(OSError):  # gone since it was listed
                if entry.is_symlink():
                    target = os.readlink(entry.path)
                try:
                    st_entry = os.stat(entry.path)
                except FileNotFoundError:
                    out[name] = ("dangling", target)
                    continue
                if stat.S_ISDIR(st_entry.st_mode):
                    # a folder's own time changes as it is listed into; its entries say
                    # what changed
                    out[name] = ("folder", target)
                    walk(entry.path, name)
                else:
                    out[name] = (st_entry.st_size, st_entry.st_mtime_ns, target)

    walk(str(folder), "")
    return out


def changes(before: dict[str, Entry] | None, after: dict[str, Entry] | None) -> list[str]:
    """What differs between two snapshots of a folder, one line each."""
    if before == after:
        return []
    if before is None:
        return ["created (it did not exist)"] + [f"added {p}" for p in sorted(after or {})]
    if after is None:
        return ["removed (it existed)"]
    return (
        [f"added {p}" for p in sorted(after.keys() - before.keys())]
        + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
        + [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    )


def settings_files(folder: Path) -> list[str]:
    """The files in ``folder`` that Prefect reads settings from, with what they set: a
    ``.env`` with ``PREFECT_`` lines, a ``prefect.toml``, a ``pyproject.toml`` with a
    ``[tool.prefect]`` table. Prefect reads them in the working folder of every process,
    and they outrank its profiles."""
    found = []
    env = folder / ".env"
    if env.is_file():  # read as Prefect reads it (pydantic-settings: python-dotenv)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            keys = [k for k in dotenv_values(env) if k.upper().startswith("PREFECT_")]
            if keys:
                found.append(f"{env} ({', '.join(keys)})")
    toml = folder / "prefect.toml"
    if toml.is_file():
        found.append(str(toml))
    pyproject = folder / "pyproject.toml"
    with contextlib.suppress(OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        if "prefect" in tomllib.loads(pyproject.read_text()).get("tool", {}):
            found.append(f"{pyproject} ([tool.prefect])")
    return found

"""A folder as a dict of relative path -> bytes, written and read back."""

from __future__ import annotations

import os


def write_tree(folder, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        path = os.path.join(folder, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return str(folder)


def read_tree(folder) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(folder):
        for n in names:
            full = os.path.join(d, n)
            with open(full, "rb") as f:
                out[os.path.relpath(full, folder).replace(os.sep, "/")] = f.read()
    return out

"""MkDocs hook: a ``popflow`` package tree that mkdocstrings can read statically.

popflow installs its layers from their own top-level folders (``schedulers/`` is
``popflow.schedulers``: setuptools' ``package-dir``), which griffe's static analysis
cannot follow: it looks for ``popflow/schedulers/``. Before mkdocstrings starts, this
hook links such a tree together under ``build/docs-api/`` (git-ignored): ``popflow/``'s
own files, and a link per layer to its folder. mkdocs.yml gives the handler that path.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority

TREE = Path("build") / "docs-api"


def link_tree(root: Path) -> Path:
    """``<root>/build/docs-api/popflow``, linked to the checkout; idempotent."""
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = setup.get("package-dir", {})
    package = root / TREE / "popflow"
    package.mkdir(parents=True, exist_ok=True)
    links = {p.name: p for p in (root / mapped.get("popflow", "popflow")).iterdir()}
    for name, folder in mapped.items():
        if name.count(".") == 1 and name.startswith("popflow."):
            links[name.split(".")[1]] = root / folder
    for entry in package.iterdir():  # what the checkout no longer has
        if entry.is_symlink() and entry.name not in links:
            entry.unlink()
    for name, target in links.items():
        link = package / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.is_symlink():
            link.unlink()
        link.symlink_to(target)
    return root / TREE


@event_priority(100)  # before mkdocstrings reads its handlers' paths
def on_config(config: Any, **kwargs: Any) -> Any:
    link_tree(Path(config["config_file_path"]).resolve().parent)
    return config

"""MkDocs hook: the module table, generated from the source tree at build time.

``docs/reference/modules.md`` holds the marker ``<!-- popflow-module-table -->``; the
hook puts there, for each layer (pyproject's ``[tool.setuptools]`` packages and their
``package-dir`` folders) and for ``examples/`` and ``benchmarks/``, each module with the
first line of its docstring. A module without a docstring is a build warning, so
``mkdocs build --strict`` fails on it.
"""

from __future__ import annotations

import ast
import logging
import re
import tomllib
from pathlib import Path
from typing import Any

MARKER = "<!-- popflow-module-table -->"
#: A Sphinx role (``:class:`~x.Y` ``), shown as the code it names.
ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
#: Folders of scripts (not packages) listed after the layers.
SCRIPT_FOLDERS = {
    "examples": "runnable examples",
    "benchmarks": "benchmarks (how to run them: `benchmarks/README.md`)",
}

log = logging.getLogger("mkdocs.hooks.module_table")


def summary(path: Path) -> str | None:
    """The module docstring's summary (its first paragraph, on one line, Sphinx roles
    as plain code), or None when it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if not doc or not doc.strip():
        return None
    paragraph = doc.strip().split("\n\n")[0]
    return ROLE.sub(r"`\1`", " ".join(line.strip() for line in paragraph.splitlines()))


def _setuptools(root: Path) -> dict[str, Any]:
    return tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folders(root: Path) -> dict[str, Path]:
    """Each installed package's folder in the checkout, from pyproject.toml."""
    setup = _setuptools(root)
    mapped = setup.get("package-dir", {})
    folders = {}
    for package in setup["packages"]:
        parents = [p for p in mapped if package == p or package.startswith(p + ".")]
        top = max(parents, key=len) if parents else ""
        rest = package[len(top) :].lstrip(".").split(".") if top else package.split(".")
        base = root / mapped[top] if top else root
        folders[package] = base.joinpath(*[r for r in rest if r])
    return folders


def _cell(text: str | None, where: str) -> str:
    if text is None:
        log.warning("module_table: %s has no docstring", where)
        return ""
    return text.replace("|", "\\|")


def _layer_rows(package: str, folder: Path, root: Path) -> list[str]:
    rows = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "__init__.py":
            continue
        name = f"{package}.{path.stem}"
        where = path.relative_to(root).as_posix()
        rows.append(f"| `{name}` | `{where}` | {_cell(summary(path), where)} |")
    return rows


def module_table(root: Path) -> str:
    """Markdown: a section per layer (top-level package), a row per module."""
    folders = package_folders(root)
    layers = list(_setuptools(root).get("package-dir", {}))  # the facade and the layers
    out = []
    for layer in sorted(layers, key=lambda p: (p != "popflow", p)):
        folder = folders[layer]
        where = folder.relative_to(root).as_posix() + "/"
        init = folder / "__init__.py"
        about = summary(init) if init.exists() else None
        out.append(f"### `{where}` (`{layer}`)\n")
        if about:
            out.append(f"{about}\n")
        out.append("| module | file | what it is |\n|---|---|---|")
        members = [
            p
            for p in folders
            if (p == layer or p.startswith(layer + "."))
            and not any(p == o or p.startswith(o + ".") for o in layers if len(o) > len(layer))
        ]
        for package in sorted(members):
            pkg_init = folders[package] / "__init__.py"
            if package != layer and pkg_init.exists():
                pkg_where = pkg_init.relative_to(root).as_posix()
                out.append(
                    f"| `{package}` | `{pkg_where}` | {_cell(summary(pkg_init), pkg_where)} |"
                )
            out.extend(_layer_rows(package, folders[package], root))
        out.append("")
    for name, what in SCRIPT_FOLDERS.items():
        folder = root / name
        out.append(f"### `{name}/`\n\n{what[0].upper() + what[1:]}.\n")
        out.append("| script | what it is |\n|---|---|")
        for path in sorted(folder.glob("*.py")):
            where = path.relative_to(root).as_posix()
            out.append(f"| `{where}` | {_cell(summary(path), where)} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    root = Path(config["config_file_path"]).resolve().parent
    return markdown.replace(MARKER, module_table(root))

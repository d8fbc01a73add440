"""MkDocs hook: ``benchmarks/RESULTS.md`` (beside the scripts) as a page of the site.

The figures live with the benchmarks that measure them; the docs link to them with
relative links that also work on GitHub (``../../benchmarks/RESULTS.md`` from
``docs/how-to/``). The hook adds the file to the site as ``benchmarks/RESULTS.md`` and
points those links at it.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

SOURCE = "benchmarks/RESULTS.md"
#: A markdown link's target: ``](target)`` or ``](target#anchor)``.
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    root = Path(config["config_file_path"]).resolve().parent
    text = (root / SOURCE).read_text(encoding="utf-8")
    files.append(File.generated(config, SOURCE, content=text))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    """A link from a page in ``docs/`` to the repository's ``benchmarks/RESULTS.md``
    becomes a link to the site's copy."""
    page_dir = posixpath.dirname(page.file.src_uri)

    def repoint(match: re.Match[str]) -> str:
        target, anchor = match.group(1), match.group(2) or ""
        in_repo = posixpath.normpath(posixpath.join("docs", page_dir, target))
        if in_repo != SOURCE:
            return match.group(0)
        return f"]({posixpath.relpath(SOURCE, page_dir or '.')}{anchor})"

    return LINK.sub(repoint, markdown)

"""MkDocs hook: the command line reference, generated from ``popflow``'s argparse parser.

``docs/reference/cli.md`` holds the marker ``<!-- popflow-cli-help -->``; the hook puts
there each command's ``--help``, as ``popflow`` prints it, so the page cannot drift
from the parser.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- popflow-cli-help -->"
#: The width help is wrapped to, whatever the terminal that builds the docs.
COLUMNS = "88"


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


def popflow_parser() -> argparse.ArgumentParser:
    """The parser ``popflow`` parses its arguments with: ``build_parser()`` where the CLI
    has one, else the one ``main`` builds, caught at its ``parse_args`` call."""
    from popflow.flows.api import cli

    build = getattr(cli, "build_parser", None)
    if build is not None:
        return build()

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        cli.main(["--help"])
    except _Captured as caught:
        return caught.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise RuntimeError("popflow.flows.api.cli.main never called parse_args")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_markdown() -> str:
    """Each command's help as a section: ``popflow`` first, then its subcommands."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS  # argparse's formatter reads it
    try:
        parser = popflow_parser()
        parts = [f"### `popflow`\n\n```text\n{parser.format_help().rstrip()}\n```\n"]
        for name, sub in _subcommands(parser).items():
            parts.append(f"### `popflow {name}`\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_markdown())

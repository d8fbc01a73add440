"""Seconds per test file, before and after, from two pytest junit XML files.

    python tests/support/timings.py before-junit.xml after-junit.xml [--top 25]

Prints a Markdown table of the slowest files (by the larger of the two times), the
total of each column and the test counts; a file only one run has shows ``-``.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict


def per_file(path: str) -> tuple[dict[str, float], int]:
    """Seconds per test file (summed over its tests) and the number of tests in ``path``."""
    seconds: dict[str, float] = defaultdict(float)
    count = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        # classname is the module's dotted path ("tests.test_s3" or "tests.test_s3.TestX")
        parts = case.get("classname", "").split(".")
        module = next((p for p in parts if p.startswith("test_")), parts[-1])
        seconds[f"{module}.py"] += float(case.get("time", 0.0))
        count += 1
    return dict(seconds), count


def table(before: str, after: str, top: int = 25) -> str:
    old, old_n = per_file(before)
    new, new_n = per_file(after)
    files = sorted(set(old) | set(new), key=lambda f: -max(old.get(f, 0), new.get(f, 0)))

    def cell(times: dict[str, float], name: str) -> str:
        return f"{times[name]:.1f}" if name in times else "-"

    lines = ["| file | before (s) | after (s) |", "| --- | ---: | ---: |"]
    lines += [f"| {f} | {cell(old, f)} | {cell(new, f)} |" for f in files[:top]]
    lines.append(
        f"| total ({len(files)} files) | {sum(old.values()):.1f} | {sum(new.values()):.1f} |"
    )
    lines.append(f"| tests | {old_n} | {new_n} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(table(args.before, args.after, args.top))


if __name__ == "__main__":
    main()

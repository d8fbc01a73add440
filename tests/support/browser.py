"""What a person sees of a web page: Chromium (Debian's ``chromium``, installed by
``.ci/run``) renders it headless, its scripts run, and the text of the page is read."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import tempfile

#: Chromium's flags for this closed machine: without the networking ones it tries to
#: reach Google's hosts at every start and its connections are refused.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError("Chromium is not installed: .ci/run installs Debian's chromium")
    return path


def rendered_text(url: str, budget_ms: int = 20_000, timeout_s: float = 180) -> str:
    """The text of ``url`` once its scripts have run for ``budget_ms`` of virtual time
    (Chromium fast-forwards timers and waits for the page's requests)."""
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [chromium(), *FLAGS, f"--user-data-dir={profile}",
             f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"chromium exited with {out.returncode}: {out.stderr[-2000:]}")
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", out.stdout, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body))).strip()

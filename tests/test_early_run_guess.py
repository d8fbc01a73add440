"""Which server the record makes its flow run on before Prefect's import
(``flows/record/early_run.py::early_api_url``): the one Prefect would report to, read as
Prefect reads its settings, or none where only Prefect can tell. Each case in a fresh
Python, where Prefect is not imported (as in a user's script)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

GUESS = (
    "import sys\n"
    "from popflow.flows.record.early_run import early_api_url\n"
    "url = early_api_url()\n"
    "assert 'prefect.settings' not in sys.modules, 'the guess imported Prefect'\n"
    "print(url)\n"
)


def guess(tmp_path: Path, env: dict[str, str] | None = None, profiles: str | None = None) -> str:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if profiles is not None:
        (home / "profiles.toml").write_text(profiles)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "POPFLOW_"))}
    out = subprocess.run(
        [sys.executable, "-c", GUESS],
        cwd=tmp_path,
        env={**clean, "PREFECT_HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def test_the_environments_url_is_the_guess(tmp_path):
    assert (
        guess(tmp_path, {"PREFECT_API_URL": "http://127.0.0.1:9/api/"}) == "http://127.0.0.1:9/api"
    )


def test_credentials_leave_it_to_prefect(tmp_path):
    env = {"PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_API_KEY": "pnu_x"}
    assert guess(tmp_path, env) == "None"
    profile = '[profiles.work]\nPREFECT_API_URL = "http://h:1/api"\nPREFECT_API_KEY = "k"\n'
    assert guess(tmp_path, {"PREFECT_PROFILE": "work"}, profile) == "None"


def test_the_active_profiles_url_is_the_guess(tmp_path):
    profiles = (
        'active = "work"\n'
        '[profiles.work]\nPREFECT_API_URL = "http://127.0.0.1:9/api"\n'
        '[profiles.other]\nPREFECT_API_URL = "http://127.0.0.1:8/api"\n'
    )
    assert guess(tmp_path, profiles=profiles) == "http://127.0.0.1:9/api"
    assert guess(tmp_path, {"PREFECT_PROFILE": "other"}, profiles) == "http://127.0.0.1:8/api"


@pytest.mark.parametrize(
    ("name", "text"),
    [
        (".env", "PREFECT_API_URL=http://127.0.0.1:7/api\n"),
        ("prefect.toml", '[api]\nurl = "http://127.0.0.1:7/api"\n'),
        ("pyproject.toml", '[tool.prefect.api]\nurl = "http://127.0.0.1:7/api"\n'),
    ],
)
def test_a_settings_file_in_the_working_folder_leaves_it_to_prefect(tmp_path, name, text):
    """Prefect reads these over the profile: only Prefect knows what they say."""
    profiles = 'active = "work"\n[profiles.work]\nPREFECT_API_URL = "http://127.0.0.1:9/api"\n'
    (tmp_path / name).write_text(text)
    assert guess(tmp_path, profiles=profiles) == "None"


def test_no_server_known_and_none_running_is_no_guess(tmp_path):
    """The embedded default's first run (its local server not started yet)."""
    assert guess(tmp_path) == "None"
    assert guess(tmp_path, profiles="not toml [") == "None"

"""``popflow.infra.store.layout`` is the one module that spells the experiment folder's paths.

The names are checked against literal spellings here (not against the module's own
constants), so a change to the on-disk layout fails a test; ``test_layout_resume.py``
checks a whole run's folder and its resume.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from popflow.infra.store import layout

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = Path("infra/store/layout.py")
#: The layers whose modules must take the folder's names from ``layout``.
SCANNED = ("flows", "tasks", "infra", "popflow")

#: A string literal (or an f-string's literal part) matching one of these spells a path of
#: the experiment folder.
SPELLINGS = {
    "popflow's folder or the manifest": r"\.popflow",
    "a trial's config": r"params\.json",
    "a trial's results": r"result\.json",
    "a trial's CSV": r"progress\.csv",
    "a trial's error": r"error\.txt",
    "the exploits": r"pbt_global\.txt",
    "a lineage": r"pbt_policy_",
    "the experiment's record": r"experiment\.json",
    "the run's arguments": r"(run|tune)_args\.(json|pkl)",
    "the code's origin": r"code\.json",
    "a dict checkpoint": r"_dict_checkpoint\.pkl",
    "TensorBoard's files": r"events\.out\.tfevents",
    "scratch names": r"\.(tmp|old)-",
    "a checkpoint folder": r"^checkpoint_([0-9]|$)",
    "a folder in .popflow": r"^/?(commits|lease|parameters)(/|$)",
}

#: (module, spelling) pairs allowed outside ``layout``, each with its reason.
ALLOWED = {
    (
        "infra/storage/local_files.py",
        "scratch names",
    ): "infra/storage is below infra/store (store imports storage; the acyclic-siblings "
    "contract forbids the reverse): any file it writes is staged in a '<file>.tmp-<hex>' "
    "sibling of its own, removed at once, which layout's scratch markers also match",
    (
        "flows/integrations/wandb.py",
        "a checkpoint folder",
    ): "Ray's name for a W&B model artifact ('checkpoint_<trial>'), in W&B, not a path",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string statements (docstrings, attribute docs): prose, not paths."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def spellings(path: Path) -> set[tuple[str, str]]:
    """``(what, literal)`` for each layout name the module at ``path`` spells."""
    tree = ast.parse(path.read_text(), str(path))
    prose = docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            for what, pattern in SPELLINGS.items():
                if re.search(pattern, node.value):
                    found.add((what, node.value))
    return found


def test_no_module_but_layout_spells_a_path_of_the_experiment_folder():
    found = []
    for layer in SCANNED:
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel == LAYOUT:
                continue
            for what, literal in sorted(spellings(path)):
                if (rel.as_posix(), what) not in ALLOWED:
                    found.append(f"{rel}: {literal!r} ({what})")
    assert found == [], "use popflow.infra.store.layout instead:\n" + "\n".join(found)


def test_every_spelling_the_guard_looks_for_is_in_layout():
    """The guard cannot go stale: each name it looks for is one layout spells."""
    found = {what for what, _ in spellings(ROOT / LAYOUT)}
    assert found == set(SPELLINGS)
    assert all((ROOT / module).exists() and what in SPELLINGS for module, what in ALLOWED)


def test_the_guard_sees_a_path_spelled_in_a_module(tmp_path):
    """The guard's deliberately broken case: a module that builds a trial's path itself."""
    module = tmp_path / "spelled.py"
    module.write_text(
        '"""A docstring may say result.json."""\n'
        "def results(trial_dir):\n"
        '    return f"{trial_dir}/result.json"\n'
        "def checkpoint(i):\n"
        '    return f"checkpoint_{i:06d}"\n'
    )
    assert spellings(module) == {
        ("a trial's results", "/result.json"),
        ("a checkpoint folder", "checkpoint_"),
    }


@pytest.mark.parametrize(
    "made, written",
    [
        (layout.commit_path(12), ".popflow/commits/00000012.json"),
        (layout.lease_path(3), ".popflow/lease/00000003.json"),
        (layout.EXPERIMENT_FILE, ".popflow/experiment.json"),
        (layout.RUN_ARGS_FILE, ".popflow/run_args.json"),
        (layout.PICKLED_ARGS_FILE, ".popflow/run_args.pkl"),
        (layout.OLD_RUN_ARGS_FILE, ".popflow/tune_args.pkl"),
        (layout.CODE_FILE, ".popflow/code.json"),
        (layout.parameters_path("ab" * 32), ".popflow/parameters/" + "ab" * 16 + ".pkl"),
        (layout.GLOBAL_POLICY, "pbt_global.txt"),
        (layout.policy_file("5d2a1_00001"), "pbt_policy_5d2a1_00001.txt"),
        (layout.trial_dir("Parity", "5d2a1_00001"), "Parity_5d2a1_00001"),
        (layout.restarted_trial_dir("Parity_5d2a1_00001", 2), "Parity_5d2a1_00001_r2"),
        (
            (layout.PARAMS, layout.RESULTS, layout.PROGRESS),
            ("params.json", "result.json", "progress.csv"),
        ),
        (layout.ERROR_FILE, "error.txt"),
        (layout.checkpoint_path("T", layout.checkpoint_name(10, set())), "T/checkpoint_000010"),
        (layout.checkpoint_name(10, {"checkpoint_000010"}), "checkpoint_000010_1"),
        (layout.MANIFEST, ".popflow_manifest.json"),
        (layout.DICT_CHECKPOINT_FILE, "_dict_checkpoint.pkl"),
        (layout.TENSORBOARD_EVENTS, "events.out.tfevents."),
    ],
)
def test_the_names_are_the_ones_earlier_versions_wrote(made, written):
    assert made == written


def test_numbered_files_are_read_back_from_a_listing():
    names = ["00000002.json", "00000001.json", "00000003.json.tmp-1a2b3c4d", "notes.txt"]
    assert layout.commit_seqs(names) == [1, 2]
    assert layout.lease_epochs_in(names) == [1, 2]
    assert layout.is_checkpoint_name("checkpoint_000010_2")
    assert not layout.is_checkpoint_name("checkpoint_10")
    assert layout.is_parameters_path(layout.parameters_path("0f" * 32))
    assert not layout.is_parameters_path(".popflow/parameters/../x.pkl")


@pytest.mark.parametrize("number", [0, 1, 12, 99_999_999, 10**8, 10**9 + 7, layout.MAX_NUMBER])
def test_numbered_names_read_back_as_their_numbers_at_any_digit_count(number):
    for path, read_back in (
        (layout.lease_path(number), layout.lease_epochs_in),
        (layout.commit_path(number), layout.commit_seqs),
    ):
        name = path.rsplit("/", 1)[1]
        assert read_back([name]) == [number]
        assert layout.stray_numbered_names([name]) == []


def test_numbered_names_compare_as_numbers_not_as_text():
    """Epoch 10**8's name has nine digits; it is newer than 99999999, not 10000000."""
    names = ["99999999.json", "100000000.json", "100000001.json", "00000007.json"]
    expected = [7, 99_999_999, 10**8, 10**8 + 1]
    assert layout.lease_epochs_in(names) == expected
    assert layout.commit_seqs(names) == expected


@pytest.mark.parametrize(
    "name",
    [
        "000000012.json",  # 12 padded to nine digits: commit 12 is 00000012.json
        "0000001x.json",
        "00000001abc.json",
        "\u0660" * 7 + "\u0661.json",  # Arabic-Indic digits: str.isdigit and int take them
        "00000001\u00b2.json",
        "1234567.json",  # fewer than 8 digits
        "999999999999999999999.json",  # beyond MAX_NUMBER: no run gets there
        "1" + "0" * 5000 + ".json",  # int() refuses over 4,300 digits
        "+0000001.json",
        " 00000001.json",
    ],
)
def test_names_no_popflow_wrote_are_skipped_by_every_reader(name):
    names = ["00000003.json", name]
    assert layout.lease_epochs_in(names) == [3]
    assert layout.commit_seqs(names) == [3]
    assert layout.stray_numbered_names(names) == [name]


@pytest.mark.parametrize("number", [-1, layout.MAX_NUMBER + 1])
def test_no_path_is_numbered_beyond_what_the_readers_read(number):
    with pytest.raises(ValueError, match="numbers its files from 0 to 999999999999999"):
        layout.lease_path(number)
    with pytest.raises(ValueError, match="numbers its files"):
        layout.commit_path(number)


def test_scratch_names_are_new_each_time_and_recognised():
    made = [
        layout.staging_path("T/checkpoint_000001"),
        layout.trash_path("T/checkpoint_000001"),
        layout.save_folder("T"),
    ]
    assert re.fullmatch(r"T/checkpoint_000001\.tmp-[0-9a-f]{8}", made[0])
    assert re.fullmatch(r"T/checkpoint_000001\.old-[0-9a-f]{8}", made[1])
    assert re.fullmatch(r"T/save\.tmp-[0-9a-f]{8}", made[2])
    assert all(layout.is_scratch(m.rsplit("/", 1)[1]) for m in made)
    assert layout.staging_path("x") != layout.staging_path("x")
    assert not layout.is_scratch("checkpoint_000001")

"""infra.storage.Storage on a local folder (and fsspec's in-memory store for the object-store path)."""

from __future__ import annotations

import os
import pickle
import threading
import uuid

import pytest

from popflow.infra.storage.folder import Storage

pytestmark = pytest.mark.unit


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "root"))


def leftovers(folder) -> list[str]:
    """Temporary files a write left behind anywhere under ``folder``."""
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if ".tmp-" in f]


# -- identity, paths -------------------------------------------------------------


def test_empty_url_is_refused():
    with pytest.raises(ValueError, match="`storage` is empty"):
        Storage("")


def test_local_root_is_absolute_and_paths_join_under_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = Storage("results")
    assert s.is_local
    assert s.root == str(tmp_path / "results")
    assert s.url == s.root
    assert s.path() == s.root
    assert s.path("a", "b.txt") == f"{s.root}/a/b.txt"
    assert s.path("a/b", "c") == f"{s.root}/a/b/c"
    assert s.full_url("x") == f"{s.root}/x"


def test_absolute_parts_cannot_escape_the_root(storage):
    with pytest.raises(
        ValueError, match=r"storage path part '/etc' is absolute; give paths relative to /"
    ):
        storage.path("/etc", "passwd")
    with pytest.raises(ValueError, match="is absolute"):
        storage.child("/elsewhere")
    with pytest.raises(ValueError, match="is absolute"):
        storage.remove("a", "/b")


def test_file_url_is_a_local_folder(tmp_path):
    s = Storage(f"file://{tmp_path}/root")
    assert s.is_local
    assert s.protocol == "file"
    assert s.root == f"{tmp_path}/root"
    s.write_text("hello", "a", "f.txt")
    assert (tmp_path / "root" / "a" / "f.txt").read_text() == "hello"
    assert Storage(str(tmp_path / "root")).read_text("a", "f.txt") == "hello"


def test_child_is_rooted_at_the_subfolder_and_shares_the_filesystem(storage):
    child = storage.child("exp", "trial_1")
    assert child.root == storage.path("exp", "trial_1")
    assert child.fs is storage.fs
    assert child.is_local and child.protocol == storage.protocol
    child.write_text("x", "params.json")
    assert storage.read_text("exp", "trial_1", "params.json") == "x"
    assert storage.root != child.root  # the parent is unchanged


# -- atomic writes ---------------------------------------------------------------


def test_write_bytes_replaces_the_target_whole_and_leaves_no_temp_file(storage):
    storage.write_bytes(b"a" * 100_000, "dir", "blob")
    storage.write_bytes(b"short", "dir", "blob")
    assert storage.read_bytes("dir", "blob") == b"short"  # no tail of the old content
    assert storage.listdir("dir") == ["blob"]
    storage.write_bytes(b"durable", "dir", "blob", durable=True)
    assert storage.read_bytes("dir", "blob") == b"durable"
    assert leftovers(storage.root) == []


def test_failed_write_keeps_the_old_object_and_leaves_no_temp_file(storage):
    storage.write_bytes(b"old", "blob")
    with pytest.raises(TypeError):
        storage.write_bytes("not bytes", "blob")  # type: ignore[arg-type]
    assert storage.read_bytes("blob") == b"old"
    assert leftovers(storage.root) == []


def test_concurrent_reader_sees_only_whole_old_or_new_content(storage):
    size = 2 << 20  # 2 MiB: one write takes many read syscalls to see through
    payloads = [bytes([65 + i]) * size for i in range(2)]
    storage.write_bytes(payloads[0], "big")
    stop = threading.Event()
    seen: set[bytes] = set()
    bad: list[str] = []

    def reader() -> None:
        for _ in range(5_000):  # bounded even if the writer dies
            if stop.is_set():
                return
            try:
                data = storage.read_bytes("big")
            except FileNotFoundError:
                bad.append("target missing during a rewrite")
                return
            if data not in payloads:
                bad.append(
                    f"partial read: {len(data)} bytes, first {data[:1]!r}, last {data[-1:]!r}"
                )
                return
            seen.add(data[:1])

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            storage.write_bytes(payloads[i % 2], "big")
    finally:
        stop.set()
        t.join()
    assert bad == []
    assert seen  # the reader did read
    assert storage.read_bytes("big") == payloads[1]
    assert leftovers(storage.root) == []


# -- appends, truncation ---------------------------------------------------------


def test_append_text_returns_sizes_and_truncate_cuts_back(storage):
    assert storage.append_text("abc\n", "logs", "result.json") == 4
    assert storage.append_text("dé\n", "logs", "result.json") == 4 + 4  # bytes, not characters
    assert storage.size("logs", "result.json") == 8
    storage.truncate(4, "logs", "result.json")
    assert storage.read_text("logs", "result.json") == "abc\n"
    assert storage.append_text("x", "logs", "result.json") == 5


def test_truncate_never_extends_and_ignores_missing_files(storage):
    storage.write_text("abc", "f")
    storage.adopt_log(10, "f")  # a log written before: taken over, never extended
    storage.truncate(10, "f")
    assert storage.read_bytes("f") == b"abc"
    storage.truncate(0, "missing")
    storage.adopt_log(0, "missing")
    assert not storage.exists("missing")


# -- listing, removal, folders ---------------------------------------------------


def test_listdir_gives_sorted_names_and_missing_folder_is_empty(storage):
    assert storage.listdir("nope") == []
    storage.write_text("1", "d", "b")
    storage.write_text("2", "d", "a")
    storage.write_text("3", "d", "sub", "c")
    assert storage.listdir("d") == ["a", "b", "sub"]
    assert list(storage.walk_files("d")) == ["a", "b", "sub/c"]
    assert list(storage.walk_files("nope")) == []


def test_remove_file_folder_and_missing(storage):
    storage.write_text("1", "d", "sub", "c")
    storage.write_text("2", "f")
    storage.remove("f")
    assert not storage.exists("f")
    storage.remove("d")
    assert not storage.exists("d")
    storage.remove("never", "there")  # missing is fine


def test_rename_moves_a_folder(storage):
    storage.write_text("1", "a", "x")
    storage.rename(("a",), ("b",))
    assert not storage.exists("a")
    assert storage.read_text("b", "x") == "1"


def test_put_dir_get_dir_round_trip(storage, tmp_path):
    src = tmp_path / "src"
    (src / "nested" / "deeper").mkdir(parents=True)
    files = {
        "top.bin": bytes(range(256)) * 10,
        "nested/n.txt": b"nested",
        "nested/deeper/d.txt": b"",
    }
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    storage.put_dir(str(src), "ckpt")
    assert sorted(storage.walk_files("ckpt")) == sorted(files)
    dst = tmp_path / "dst"
    storage.get_dir(str(dst), "ckpt")
    got = {p.relative_to(dst).as_posix(): p.read_bytes() for p in dst.rglob("*") if p.is_file()}
    assert got == files


# -- pickling and secrets --------------------------------------------------------


def test_pickled_storage_recreates_its_filesystem_lazily(storage):
    storage.write_text("v", "f")
    state = storage.__getstate__()
    assert state["_fs"] is None
    clone = pickle.loads(pickle.dumps(storage))
    assert clone._fs is None
    assert clone.root == storage.root and clone.url == storage.url
    assert clone.read_text("f") == "v"  # creates the filesystem on first use
    assert clone._fs is not None


def test_repr_never_shows_storage_options(tmp_path):
    secret = "AKIA-SUPER-SECRET-" + uuid.uuid4().hex
    s = Storage(str(tmp_path), {"auto_mkdir": True, "secret": secret})
    for text in (repr(s), str(s), repr(s.child("a")), repr([s])):
        assert secret not in text
        assert text.startswith("Storage(") or text.startswith("[Storage(")
    assert repr(s) == f"Storage({str(tmp_path)!r})"
    # back in this process only (workers get it from the run's credentials plugin)
    assert pickle.loads(pickle.dumps(s)).storage_options["secret"] == secret
    from popflow.infra.storage.credentials import StorageOptions

    from_run_config = Storage(str(tmp_path), StorageOptions({"secret": secret}))
    assert from_run_config.storage_options["secret"] == secret


# -- object-store path (fsspec's in-memory filesystem) ---------------------------


@pytest.fixture
def memory_storage():
    s = Storage(f"memory://popflow-test-{uuid.uuid4().hex}")
    yield s
    s.remove()


def test_object_store_append_truncate_and_listdir(memory_storage):
    s = memory_storage
    assert not s.is_local
    assert s.url.startswith("memory://")
    assert s.append_text("ab", "log") == 2
    assert s.append_text("cd", "log") == 4
    s.truncate(3, "log")
    assert s.read_text("log") == "abc"
    s.truncate(10, "log")
    assert s.read_text("log") == "abc"
    assert s.listdir("missing") == []
    s.remove("missing")
    s.write_bytes(b"x", "d", "f")
    assert s.listdir("d") == ["f"]
    assert list(s.walk_files()) == ["d/f", "log"]


def test_file_exists_sees_files_not_folders(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_text("x", "dir", "file")
    assert storage.file_exists("dir", "file")
    assert not storage.file_exists("dir", "missing")
    assert not storage.file_exists("dir")

"""infra.storage.Storage on S3 (moto's S3 server, a real process), retries, secrets, full disk."""

from __future__ import annotations

import errno
import logging
import os
import pickle
import random
import re
import time
import uuid
from typing import Any

import pytest
import s3fs
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError
from s3fs.errors import translate_boto_error
from support.s3 import FAST
from support.trees import read_tree, write_tree

import popflow.infra.storage.local_files as local_files
from popflow.infra.storage.credentials import redact, secret_values
from popflow.infra.storage.errors import StorageError, is_transient
from popflow.infra.storage.folder import LogChanged, Storage
from popflow.infra.storage.retry import RetryPolicy, backoff_delay


def client_error(status: int, code: str, op: str = "PutObject") -> ClientError:
    return ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} says the server"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


def transient_errors() -> list[BaseException]:
    """What a flaky network and an overloaded S3 look like to s3fs's callers."""
    return [
        TimeoutError("read timed out"),
        ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
        translate_boto_error(client_error(500, "InternalError")),  # OSError(EREMOTEIO)
        translate_boto_error(client_error(503, "SlowDown")),  # OSError(EBUSY)
        client_error(503, "SlowDown"),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:1"),
    ]


class FlakyFS:
    """Wraps a filesystem so that a fraction of its calls fail with transient errors.

    A failing call raises *before* the real call (the request never arrived)
    or, for writes, *after* it (the request was applied but the answer was
    lost): a retry must then neither duplicate nor lose anything. No method
    fails more than ``max_in_a_row`` times in a row, so retries get through.
    """

    METHODS = (
        "cat_file",
        "pipe_file",
        "ls",
        "find",
        "exists",
        "size",
        "get_file",
        "put_file",
        "rm",
        "cp_file",
    )
    WRITES = ("pipe_file", "put_file", "rm", "cp_file")

    def __init__(self, fs: Any, fraction: float, seed: int = 0, max_in_a_row: int = 2) -> None:
        self._fs = fs
        self._fraction = fraction
        self._rng = random.Random(seed)
        self._errors = transient_errors()
        self._max_in_a_row = max_in_a_row
        self._in_a_row: dict[str, int] = {}
        self.injected = 0
        self.applied_then_failed = 0
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in self.METHODS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            fail = (
                self._rng.random() < self._fraction
                and self._in_a_row.get(name, 0) < self._max_in_a_row
            )
            if not fail:
                self._in_a_row[name] = 0
                return attr(*args, **kwargs)
            self._in_a_row[name] = self._in_a_row.get(name, 0) + 1
            if name in self.WRITES and self._rng.random() < 0.5:
                attr(*args, **kwargs)  # applied (if it can be), but the caller hears a failure
                self.applied_then_failed += 1
            self.injected += 1
            raise self._errors[self.injected % len(self._errors)]

        return call


class BrokenFS:
    """Wraps a filesystem so that every call of ``method`` raises ``error``."""

    def __init__(self, fs: Any, method: str, error: BaseException) -> None:
        self._fs, self._method, self._error = fs, method, error
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        if name != self._method:
            return getattr(self._fs, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            raise self._error

        return call


@pytest.fixture
def reader(s3_server) -> s3fs.S3FileSystem:
    """An independent S3 client (its own caches), as another process would have."""
    _, options = s3_server
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


TREE = {
    "top.bin": bytes(range(256)) * 10,
    "nested/n.txt": b"nested",
    "nested/deeper/d.txt": b"",
}


# -- URLs and paths --------------------------------------------------------------


@pytest.mark.integration
def test_s3_url_root_paths_and_child(s3_server, s3_bucket):
    _, options = s3_server
    s = Storage(f"s3://{s3_bucket}/experiments/", options)
    assert not s.is_local and s.protocol == "s3"
    assert s.root == f"{s3_bucket}/experiments"
    assert s.url == f"s3://{s3_bucket}/experiments"
    assert s.path("exp", "t1/result.json") == f"{s3_bucket}/experiments/exp/t1/result.json"
    assert s.full_url("exp", "f") == f"s3://{s3_bucket}/experiments/exp/f"
    child = s.child("exp")
    assert child.url == f"s3://{s3_bucket}/experiments/exp"
    assert child.fs is s.fs and child.storage_options == options
    with pytest.raises(ValueError, match="is absolute"):
        s.path("/etc")


# -- writes, reads, appends --------------------------------------------------------


@pytest.mark.integration
def test_write_read_and_overwrite_are_seen_by_another_client(s3, reader):
    s3.write_bytes(b"a" * 100_000, "dir", "blob")
    s3.write_bytes(b"short", "dir", "blob", durable=True)
    assert s3.read_bytes("dir", "blob") == b"short"
    assert reader.cat_file(s3.path("dir", "blob")) == b"short"  # no tail of the old content
    assert s3.size("dir", "blob") == 5
    s3.write_text("héllo", "t.txt")
    assert s3.read_text("t.txt") == "héllo"
    assert s3.exists("dir") and s3.exists("dir", "blob") and not s3.exists("nope")


@pytest.mark.integration
def test_missing_object_raises_file_not_found_unchanged(s3):
    with pytest.raises(FileNotFoundError) as info:
        s3.read_bytes("missing")
    assert type(info.value) is FileNotFoundError  # not wrapped: callers rely on it
    with pytest.raises(FileNotFoundError):
        s3.get_file("/tmp/never-written", "missing")


@pytest.mark.integration
def test_append_text_and_truncate(s3, reader):
    assert s3.append_text("abc\n", "logs", "result.json") == 4
    assert s3.append_text("dé\n", "logs", "result.json") == 8  # bytes, not characters
    assert s3.size("logs", "result.json") == 8
    s3.truncate(4, "logs", "result.json")
    assert reader.cat_file(s3.path("logs", "result.json")) == b"abc\n"
    s3.truncate(10, "logs", "result.json")  # never extends
    assert s3.read_text("logs", "result.json") == "abc\n"
    assert s3.append_text("x", "logs", "result.json") == 5
    s3.truncate(0, "missing")
    assert not s3.exists("missing")


class CountingFS:
    """Wraps a filesystem; records (method, IfMatch given) of reads and writes of objects.

    ``on_conditional``: called instead of a conditional PUT (with the real call)
    to script what the server does.
    """

    def __init__(self, fs: Any, on_conditional: Any = None) -> None:
        self._fs = fs
        self._on_conditional = on_conditional
        self.calls: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name not in ("pipe_file", "cat_file"):
            return attr

        def call(path: str, *args: Any, **kwargs: Any) -> Any:
            conditional = "IfMatch" in kwargs
            self.calls.append((name, conditional))
            if conditional and self._on_conditional is not None:
                return self._on_conditional(lambda: attr(path, *args, **kwargs))
            return attr(path, *args, **kwargs)

        return call


@pytest.mark.integration
def test_appends_after_the_first_are_one_conditional_put(s3, reader):
    counting = CountingFS(s3.fs)
    s3._fs = counting
    s3.append_text("a\n", "log")  # created: a PUT conditional on the name being free
    assert counting.calls == [("pipe_file", False)]
    counting.calls.clear()
    for line in "bcd":
        s3.append_text(f"{line}\n", "log")
    assert counting.calls == [("pipe_file", True)] * 3  # no read
    assert reader.cat_file(s3.path("log")) == b"a\nb\nc\nd\n"


@pytest.mark.integration
def test_an_append_over_another_writers_change_writes_nothing(s3, reader):
    """The fencing break: a stale driver's append once re-read the log and wrote its line
    on top of the newer driver's (iterations 1..8, 1..8). Now it is refused."""
    s3.append_text("mine 1\n", "log")
    reader.pipe_file(s3.path("log"), b"mine 1\ntheirs\n")
    with pytest.raises(LogChanged, match="another driver wrote it"):
        s3.append_text("mine 2\n", "log")
    assert reader.cat_file(s3.path("log")) == b"mine 1\ntheirs\n"
    with pytest.raises(LogChanged, match="did not write it"):
        s3.append_text("mine 2\n", "log")  # nor later: it no longer knows the log


@pytest.mark.integration
def test_a_resume_adopts_the_logs_and_the_earlier_writer_is_fenced_out(s3, reader):
    old = s3
    old.append_text("1\n2\n", "log")
    old.append_text("3 (not committed)\n", "log")
    new = Storage(s3.url, s3.storage_options)  # the resume, under its own lease
    new.adopt_log(len(b"1\n2\n"), "log")  # cut back to the commit's size
    new.append_text("3\n", "log")
    for write in (lambda: old.append_text("4\n", "log"), lambda: old.truncate(0, "log")):
        with pytest.raises(LogChanged):
            write()
    new.append_text("4\n", "log")
    assert reader.cat_file(s3.path("log")) == b"1\n2\n3\n4\n"


@pytest.mark.integration
def test_an_adopted_log_the_earlier_writer_had_not_changed_is_still_fenced(s3, reader):
    """A resume that did not need to cut a log leaves its ETag as it was; its first
    append changes it, and the earlier writer's next append is refused."""
    s3.append_text("1\n", "log")
    new = Storage(s3.url, s3.storage_options)
    new.adopt_log(100, "log")
    new.append_text("2\n", "log")
    with pytest.raises(LogChanged):
        s3.append_text("2\n", "log")
    assert reader.cat_file(s3.path("log")) == b"1\n2\n"


@pytest.mark.integration
def test_conditional_put_applied_but_answer_lost_is_not_duplicated(s3, reader):
    def applied_then_lost(put: Any) -> Any:
        put()
        raise TimeoutError("answer lost")

    s3.append_text("1\n", "log")
    s3._fs = CountingFS(s3.fs, on_conditional=applied_then_lost)
    s3._logs._book._fs = s3._fs
    s3.append_text("2\n", "log")  # retried: 412 (it had applied), read back: it is there
    assert reader.cat_file(s3.path("log")) == b"1\n2\n"


@pytest.mark.integration
def test_store_without_conditional_puts_falls_back_to_size_checked_writes(s3, reader, caplog):
    def not_implemented(put: Any) -> Any:
        raise translate_boto_error(client_error(501, "NotImplemented"))

    s3.append_text("1\n", "log")
    counting = CountingFS(s3.fs, on_conditional=not_implemented)
    s3._fs = counting
    s3._logs._book._fs = counting
    for line in "234":
        s3.append_text(f"{line}\n", "log")
    assert reader.cat_file(s3.path("log")) == b"1\n2\n3\n4\n"
    assert counting.calls[0] == ("pipe_file", True)  # tried once, then never again
    assert counting.calls[1:] == [("pipe_file", False)] * 3  # no read: the size is checked
    assert "no conditional PUT" in caplog.text
    reader.pipe_file(s3.path("log"), b"1\n2\n3\n4\ntheirs\n")
    with pytest.raises(LogChanged):  # still fenced, by size
        s3.append_text("5\n", "log")


@pytest.mark.integration
def test_pickled_storage_does_not_carry_what_it_knows_of_its_logs(s3):
    s3.append_text("x\n", "log")
    assert s3._logs is not None and s3._logs.known == 1
    assert pickle.loads(pickle.dumps(s3))._logs is None and s3.child("a")._logs is None


# -- listings see every write (s3fs caches listings) ------------------------------


@pytest.mark.integration
def test_listdir_sees_writes_and_removes_of_this_and_other_clients(s3, reader):
    assert s3.listdir("d") == []
    s3.write_text("1", "d", "b")
    assert s3.listdir("d") == ["b"]  # the listing is now in s3fs's cache
    s3.write_text("2", "d", "a")
    s3.write_text("3", "d", "sub", "c")
    assert s3.listdir("d") == ["a", "b", "sub"]
    reader.pipe_file(s3.path("d", "z"), b"from a worker")  # another process writes
    assert s3.listdir("d") == ["a", "b", "sub", "z"]
    assert s3.exists("d", "z") and s3.size("d", "z") == len(b"from a worker")
    reader.rm(s3.path("d", "a"))
    assert s3.listdir("d") == ["b", "sub", "z"]
    assert not s3.exists("d", "a")
    s3.remove("d", "sub")
    assert s3.listdir("d") == ["b", "z"]
    assert list(s3.walk_files("d")) == ["b", "z"]
    assert list(s3.walk_files("nope")) == []


@pytest.mark.integration
def test_remove_file_folder_and_missing(s3, reader):
    s3.write_text("1", "d", "sub", "c")
    s3.write_text("2", "d", "e")
    s3.write_text("3", "f")
    s3.remove("f")
    assert not s3.exists("f")
    s3.remove("d")  # recursive
    assert not s3.exists("d") and s3.listdir("d") == []
    assert reader.find(s3.path()) == []
    s3.remove("never", "there")  # missing is fine


@pytest.mark.integration
def test_put_dir_get_dir_round_trip(s3, tmp_path, reader):
    src = write_tree(tmp_path / "src", TREE)
    s3.put_dir(src, "ckpt")
    assert sorted(s3.walk_files("ckpt")) == sorted(TREE)
    assert reader.cat_file(s3.path("ckpt", "nested", "n.txt")) == b"nested"
    s3.get_dir(str(tmp_path / "dst"), "ckpt")
    assert read_tree(tmp_path / "dst") == TREE


@pytest.mark.integration
def test_rename_moves_a_folder_and_a_file(s3):
    s3.write_text("1", "a", "x")
    s3.write_text("2", "a", "deep", "y")
    s3.rename(("a",), ("b",))
    assert not s3.exists("a") and s3.listdir("a") == []
    assert s3.read_text("b", "x") == "1" and s3.read_text("b", "deep", "y") == "2"
    s3.rename(("b", "x"), ("c",))
    assert s3.read_text("c") == "1" and not s3.exists("b", "x")
    with pytest.raises(FileNotFoundError, match="cannot rename"):
        s3.rename(("nothing",), ("d",))


@pytest.mark.integration
def test_pickled_storage_works_in_another_process_shape(s3):
    s3.write_text("v", "f")
    clone = pickle.loads(pickle.dumps(s3))
    assert clone._fs is None and clone.url == s3.url and clone.retry == s3.retry
    assert clone.read_text("f") == "v"


# -- transient failures are retried, with nothing duplicated or lost ---------------


def workload(s: Storage, tmp_path) -> dict[str, Any]:
    """Every Storage operation; returns what the storage must hold afterwards."""
    for i in range(6):
        s.write_bytes(f"blob {i}".encode() * 100, "blobs", f"b{i}")
    sizes = [s.append_text(f"line {i}\n", "logs", "result.json") for i in range(20)]
    s.truncate(sizes[14], "logs", "result.json")  # drop lines 15..19
    s.append_text("tail\n", "logs", "result.json")
    src = write_tree(tmp_path / "src", TREE)
    s.put_dir(src, "ckpt")
    s.get_dir(str(tmp_path / "got"), "ckpt")
    assert read_tree(tmp_path / "got") == TREE
    s.rename(("ckpt",), ("moved",))
    s.remove("blobs", "b0")
    s.remove("blobs", "b0")  # again: missing is fine
    assert s.exists("moved", "top.bin") and not s.exists("ckpt", "top.bin")
    assert s.size("blobs", "b1") == len(b"blob 1") * 100
    return {
        "listing": s.listdir("blobs"),
        "log": s.read_text("logs", "result.json"),
        "moved": sorted(s.walk_files("moved")),
        "sizes": sizes,
    }


EXPECTED_LOG = "".join(f"line {i}\n" for i in range(15)) + "tail\n"


@pytest.mark.integration
def test_transient_failures_are_retried_and_nothing_is_duplicated_or_lost(s3, tmp_path, caplog):
    flaky = FlakyFS(s3.fs, fraction=0.4, seed=1)
    s3._fs = flaky
    with caplog.at_level(logging.WARNING, logger="popflow.infra.storage"):
        out = workload(s3, tmp_path)
    assert flaky.injected >= 15  # the run really was flaky (19 with this seed)
    assert flaky.applied_then_failed >= 5  # including writes that happened but "failed"
    assert out["log"] == EXPECTED_LOG  # every append once, in order, cut back exactly
    assert out["sizes"] == [sum(len(f"line {j}\n") for j in range(i + 1)) for i in range(20)]
    assert out["listing"] == [f"b{i}" for i in range(1, 6)]
    assert out["moved"] == sorted(TREE)
    retries = [r for r in caplog.records if "retrying in" in r.getMessage()]
    assert len(retries) == flaky.injected  # each failure retried once, each one logged
    assert all(r.levelno == logging.WARNING for r in retries)
    assert all(
        re.search(
            r"storage \w+ of s3://\S+ failed \(attempt \d, [0-9.]+ s into at most 5 attempts "
            r"and [0-9.]+ s\)",
            r.getMessage(),
        )
        for r in retries
    )


@pytest.mark.integration
def test_workload_without_failures_gives_the_same_storage(s3, tmp_path):
    out = workload(s3, tmp_path)
    assert out["log"] == EXPECTED_LOG
    assert out["listing"] == [f"b{i}" for i in range(1, 6)]


@pytest.mark.integration
def test_retries_run_out_with_an_error_naming_operation_and_url(s3, caplog):
    broken = BrokenFS(s3.fs, "pipe_file", TimeoutError("read timed out"))
    s3._fs = broken
    with (
        caplog.at_level(logging.WARNING, logger="popflow.infra.storage"),
        pytest.raises(StorageError) as info,
    ):
        s3.write_bytes(b"x", "f")
    assert broken.calls == 5
    message = str(info.value)
    assert re.fullmatch(
        re.escape(f"storage write of {s3.full_url('f')} failed: TimeoutError: read timed out ")
        + r"\(gave up after 5 attempts in [0-9.]+ s\)",
        message,
    )
    assert info.value.operation == "write" and info.value.url == s3.full_url("f")
    assert isinstance(info.value, OSError)  # callers catching OSError keep working
    assert len([r for r in caplog.records if "retrying in" in r.getMessage()]) == 4


@pytest.mark.integration
def test_retries_stop_at_the_deadline(s3_server, s3_url):
    _, options = s3_server
    policy = RetryPolicy(attempts=1000, base_delay=0.01, max_delay=0.01, deadline=0.1)
    s = Storage(s3_url, options, retry=policy)
    broken = BrokenFS(s.fs, "cat_file", ConnectionResetError(errno.ECONNRESET, "reset"))
    s._fs = broken
    start = time.monotonic()
    with pytest.raises(StorageError, match=r"storage read of s3://\S+/f failed: .*gave up after"):
        s.read_bytes("f")
    assert 3 <= broken.calls < 1000
    assert time.monotonic() - start < 5


@pytest.mark.integration
@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (translate_boto_error(client_error(403, "AccessDenied")), "PermissionError"),
        (client_error(400, "InvalidArgument"), "InvalidArgument"),
        (OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
    ],
)
def test_permanent_failure_raises_at_once_naming_operation_and_url(s3, caplog, error, shown):
    broken = BrokenFS(s3.fs, "pipe_file", error)
    s3._fs = broken
    with (
        caplog.at_level(logging.WARNING, logger="popflow.infra.storage"),
        pytest.raises(StorageError) as info,
    ):
        s3.append_text("x", "logs", "result.json")
    assert broken.calls == 1  # not retried
    assert info.value.__cause__ is error  # the original stays available for debugging
    assert str(info.value).startswith(
        f"storage append of {s3.full_url('logs', 'result.json')} failed: "
    )
    assert shown in str(info.value)
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


@pytest.mark.integration
def test_programming_errors_are_not_wrapped_or_retried(s3):
    broken = BrokenFS(s3.fs, "pipe_file", TypeError("bad argument"))
    s3._fs = broken
    with pytest.raises(TypeError, match="bad argument"):
        s3.write_bytes(b"x", "f")
    assert broken.calls == 1


@pytest.mark.unit
def test_storage_error_survives_pickling():  # Dask ships worker errors back pickled
    e = StorageError("write", "s3://b/k", "OSError: boom", errno.EIO)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), str(back), back.errno, back.operation, back.url) == (
        StorageError,
        str(e),
        errno.EIO,
        "write",
        "s3://b/k",
    )


# -- classification and backoff (pure) --------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("error", transient_errors())
def test_transient_errors(error):
    assert is_transient(error)


@pytest.mark.unit
@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("x"),
        PermissionError(errno.EACCES, "denied"),
        OSError(errno.ENOSPC, "No space left on device"),
        translate_boto_error(client_error(403, "AccessDenied")),
        translate_boto_error(client_error(400, "InvalidArgument")),  # OSError(EINVAL)
        translate_boto_error(client_error(400, "SomethingNew")),  # OSError(EIO), but a 400
        ValueError("not storage"),
    ],
)
def test_permanent_errors(error):
    assert not is_transient(error)


@pytest.mark.unit
def test_throttling_codes_are_transient_whatever_their_status():
    assert is_transient(client_error(400, "Throttling"))
    assert is_transient(client_error(429, "TooManyRequests"))
    assert is_transient(translate_boto_error(client_error(400, "RequestTimeout")))


@pytest.mark.unit
def test_errno_less_oserror_is_transient_only_remotely():
    assert is_transient(OSError("connection dropped"), remote=True)
    assert not is_transient(OSError("odd local failure"), remote=False)


@pytest.mark.unit
def test_backoff_grows_exponentially_with_bounded_jitter_and_a_cap():
    policy = RetryPolicy(attempts=10, base_delay=0.1, max_delay=1.0, deadline=60)
    rng = random.Random(3)
    global_state = random.getstate()
    for retry in range(1, 9):
        ceiling = min(1.0, 0.1 * 2 ** (retry - 1))
        delays = [backoff_delay(retry, policy, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 100  # jittered
    assert random.getstate() == global_state  # the global `random` is never used


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "`attempts` is 0, but must be an integer >= 1"),
        ({"base_delay": -1}, "`base_delay` is -1, but must be >= 0"),
        ({"deadline": -0.5}, "`deadline` is -0.5, but must be >= 0"),
        (
            {"base_delay": 2, "max_delay": 1},
            "`max_delay` is 1, but must be >= `base_delay` \\(2\\)",
        ),
    ],
)
def test_retry_policy_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)


# -- credentials never leak ----------------------------------------------------


@pytest.mark.integration
def test_credentials_never_appear_in_logs_reprs_errors_or_objects(
    s3_server, s3_url, tmp_path, caplog, reader
):
    _, options = s3_server
    key, secret = f"AKIA{uuid.uuid4().hex[:16].upper()}", f"sEcReT{uuid.uuid4().hex}"
    creds = {**options, "key": key, "secret": secret}  # moto accepts any credentials
    s = Storage(s3_url, creds, retry=FAST)
    assert secret_values(creds) == sorted([key, secret], key=len, reverse=True)
    with caplog.at_level(logging.DEBUG):  # every logger, botocore's wire logs included
        s.write_text("data", "exp", "a.json")
        s.append_text("line\n", "exp", "log")
        s.put_dir(write_tree(tmp_path / "src", TREE), "exp", "ckpt")
        # a transient error, then a permanent one, whose messages quote the credentials
        flaky = FlakyFS(s.fs, fraction=1.0, max_in_a_row=1)
        flaky._errors = [TimeoutError(f"timeout for {key}:{secret}")]
        s._fs = flaky
        s.write_text("again", "exp", "b.json")
        s._fs = BrokenFS(flaky._fs, "cat_file", PermissionError(f"denied {key} {secret}"))
        with pytest.raises(StorageError) as info:
            s.read_bytes("exp", "a.json")
    assert flaky.injected == 1
    assert str(info.value) == (
        f"storage read of {s.full_url('exp', 'a.json')} failed: PermissionError: denied *** ***"
    )
    assert info.value.__cause__ is None and info.value.__context__ is None  # not chained
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("popflow.infra")]
    assert any("TimeoutError: timeout for ***:***; retrying" in m for m in ours)
    texts = [
        repr(s),
        str(s),
        repr(s.child("exp")),
        str(info.value),
        repr(info.value),
        str(pickle.loads(pickle.dumps(info.value))),
        *ours,
    ]
    for text in texts:
        assert key not in text and secret not in text
    # the secret is nowhere in any log record; botocore's own DEBUG wire log shows
    # the access key id in the Authorization header (never above DEBUG)
    assert secret not in caplog.text
    assert not [r for r in caplog.records if key in r.getMessage() and r.levelno > logging.DEBUG]
    objects = reader.find(s.path())
    assert len(objects) == 2 + 1 + len(TREE)
    for obj in objects:
        data = reader.cat_file(obj)
        assert key.encode() not in data and secret.encode() not in data
    s._fs = None
    s.remove()


@pytest.mark.integration
def test_a_storage_passed_to_prefect_is_recorded_without_its_options(s3_server, s3_url):
    from prefect import flow

    @flow
    def experiment(storage: Storage) -> None:  # pragma: no cover (never run)
        pass

    _, options = s3_server
    s = Storage(s3_url, {**options, "secret": "sEcReT-prefect"})
    assert experiment.serialize_parameters({"storage": s}) == {"storage": "<Storage>"}
    assert "sEcReT" not in repr(vars(s))


@pytest.mark.unit
def test_redact_masks_every_secret():
    assert redact("a SECRETXYZ b KEYID", ["SECRETXYZ", "KEYID"]) == "a *** b ***"
    nested = {"key": "k1k1", "client_kwargs": {"aws_session_token": "tok-123"}, "anon": False}
    assert set(secret_values(nested)) == {"k1k1", "tok-123"}


# -- a full local disk ------------------------------------------------------------


def leftovers(folder) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if ".tmp-" in f]


@pytest.mark.unit
def test_full_disk_keeps_the_old_object_and_leaves_no_temp_file(tmp_path, monkeypatch):
    s = Storage(str(tmp_path / "root"), retry=FAST)
    s.write_bytes(b"old committed state", "commits", "00000001.json")
    real_open = open
    opened: list[str] = []

    class FullDisk:
        """A file whose writes stop half way with ENOSPC, as on a full disk."""

        def __init__(self, path: str, mode: str) -> None:
            self._f = real_open(path, mode)

        def write(self, data: bytes) -> int:
            self._f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        def __enter__(self) -> FullDisk:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    def full_open(path: str, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened.append(path)
        return FullDisk(path, mode)

    monkeypatch.setattr(local_files, "open", full_open, raising=False)
    target = s.path("commits", "00000001.json")
    with pytest.raises(StorageError) as info:
        s.write_bytes(b"new state that does not fit" * 1000, "commits", "00000001.json")
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"storage write of {target} failed: OSError: [Errno 28] No space left on device"
    )
    assert len(opened) == 1 and ".tmp-" in opened[0]  # not retried: a full disk stays full
    monkeypatch.undo()
    assert s.read_bytes("commits", "00000001.json") == b"old committed state"
    assert leftovers(s.root) == []


@pytest.mark.unit
def test_full_disk_at_fsync_keeps_the_old_object(tmp_path, monkeypatch):
    s = Storage(str(tmp_path / "root"))
    s.write_bytes(b"old", "f")

    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(
        StorageError, match=rf"storage write of {re.escape(s.path('f'))} failed: .*No space"
    ):
        s.write_bytes(b"new", "f", durable=True)
    monkeypatch.undo()
    assert s.read_bytes("f") == b"old"
    assert leftovers(s.root) == []


@pytest.mark.integration
def test_file_exists_is_one_request_for_a_missing_name(s3):
    """Workers look for a newer lease before each publish: one HEAD, where ``exists``
    (which also lists, to find folders) takes two for a name that is not there."""
    s3.write_text("x", "dir", "file")
    requests: list[str] = []
    s3.fs.connect()
    s3.fs.s3.meta.events.register(
        "before-send.s3", lambda request, **_: requests.append(request.method)
    )
    assert s3.file_exists("dir", "file") and requests == ["HEAD"]
    requests.clear()
    assert not s3.file_exists("dir", "missing") and requests == ["HEAD"]
    requests.clear()
    assert not s3.exists("dir", "missing") and len(requests) == 2  # what it saves
    assert not s3.file_exists("dir")  # a folder is no file

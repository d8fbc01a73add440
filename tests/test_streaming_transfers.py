"""Checkpoint files stream to and from S3: uploading or downloading a 128 MiB file through
``Storage`` on moto's S3 server raises a fresh process's peak memory by a bounded buffer
(parts of ``PART_BYTES``, ``PART_CONCURRENCY`` at a time), not by the file's size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from popflow.infra.storage.folder import PART_BYTES, PART_CONCURRENCY

pytestmark = pytest.mark.integration

MIB = 1 << 20
SIZE = 128 * MIB

SCRIPT = """
import json, os, resource, sys, tempfile
from popflow.infra.storage.folder import Storage

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

url, options, size = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
storage = Storage(url, options)
work = tempfile.mkdtemp()
small, big, back = (os.path.join(work, n) for n in ("small", "big", "back"))
with open(small, "wb") as f:
    f.write(b"x" * 1024)
storage.put_file(small, "small")  # clients, connections and imports before the measure
storage.get_file(small + ".back", "small")
with open(big, "wb") as f:
    for _ in range(size >> 20):
        f.write(os.urandom(1 << 20))
before = peak()
storage.put_file(big, "big")
put = peak()
storage.get_file(back, "big")
got = peak()
assert os.path.getsize(back) == size
print(json.dumps({"put": put - before, "get": got - put}))
"""


def test_a_large_file_streams_both_ways(s3_server, s3_url):
    _, options = s3_server
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, s3_url, json.dumps(options), str(SIZE)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    grew = json.loads(proc.stdout.strip().splitlines()[-1])
    bound = PART_BYTES * PART_CONCURRENCY + 16 * MIB  # the parts in flight, and slack
    assert bound < SIZE / 2
    assert grew["put"] < bound, f"an upload of {SIZE / MIB:.0f} MiB grew memory {grew}"
    assert grew["get"] < bound, f"a download of {SIZE / MIB:.0f} MiB grew memory {grew}"

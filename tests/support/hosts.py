"""Simulated hosts on this one machine: a network namespace per host on one bridge, and a
private scratch folder per host, for tests that run popflow across "machines".

Needs root. ``Hosts(names, tmp_path)`` is a context manager; on the way out (an exception
in the body included) it stops every process it started and deletes every namespace,
veth and the bridge it made. Each host's processes run in a mount namespace of their own
in which the host's folder (``hosts.scratch(name)``) is bind-mounted at ``hosts.SCRATCH``,
one path on every host, so a file a worker writes there is not on the driver's "disk".

Faults: ``down``/``up`` unplug a host's cable (its bridge port goes down);
``partition``/``heal`` silently drop the traffic between two hosts. This machine has no
netfilter tools or tc actions, so a partition points each host's neighbour entry for the
other at a MAC address nobody has: frames are sent, flooded, and dropped by every
receiver, so a connect times out as on a real network (a blackhole route would fail it
at once with EINVAL instead).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from support import processes
from support.polling import wait_for

log = logging.getLogger(__name__)
T = TypeVar("T")

DASK = Path(sys.executable).with_name("dask")
TESTS = Path(__file__).resolve().parents[1]
#: A MAC address no host has (locally administered): where a partition sends frames.
NOWHERE_MAC = "02:00:5e:00:de:ad"
_NAME = re.compile(r"^[a-z0-9]{1,8}$")  # "pfXXXX-" + 8 = 15, the limit for an interface name
_BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
_TAIL_CHARS = 4000


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _ip_quietly(*args: str) -> None:
    """An ``ip`` command for cleaning up: what is already gone is fine."""
    with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
        _ip(*args)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 among 10.200-255.y.0 that overlaps no route of this machine (routes cover
    the networks of other ``Hosts`` instances too: each bridge's address adds one)."""
    taken = []
    for route in json.loads(_ip("-j", "route") or "[]"):
        if route.get("dst", "default") != "default":
            taken.append(ipaddress.ip_network(route["dst"], strict=False))
    for _ in range(1000):
        net = ipaddress.IPv4Network(
            f"10.{200 + secrets.randbelow(56)}.{secrets.randbelow(256)}.0/24"
        )
        if not any(net.overlaps(t) for t in taken):
            return net
    raise RuntimeError(f"no free 10.2xx.y.0/24 beside the routes {taken}")


class Hosts:
    """Simulated hosts ``names`` (each ``[a-z0-9]{1,8}``), made on ``__enter__``."""

    def __init__(self, names: Sequence[str], tmp_path: Path) -> None:
        bad = [n for n in names if not _NAME.match(n) or n == "br"]
        if bad or len(set(names)) != len(names) or not names:
            raise ValueError(
                f"host names must be distinct, 1-8 of [a-z0-9] and not 'br'; got {list(names)}"
            )
        if len(names) > 250:
            raise ValueError(f"at most 250 hosts on a /24, not {len(names)}")
        self.names = list(names)
        self.prefix = f"pf{secrets.token_hex(2)}"
        self.root = Path(tmp_path)
        #: Where each host sees its own scratch folder: one path, a different folder per host.
        self.SCRATCH = self.root / "scratch"
        self.bridge = f"{self.prefix}-br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.bridge_address = ""
        self.started: list[subprocess.Popen] = []
        self._addresses: dict[str, str] = {}
        self._logs: dict[int, Path] = {}
        self._made_links: list[str] = []  # in the root namespace, deleted last first
        self._made_namespaces: list[str] = []
        self._bridge_nf_was: str | None = None

    # -- making and unmaking -------------------------------------------------------

    def __enter__(self) -> Hosts:
        if os.geteuid() != 0:
            raise RuntimeError(
                "simulated hosts need root (network and mount namespaces, a bridge): run "
                "`make test` as root, as CI does"
            )
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        self.SCRATCH.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        self.subnet = free_subnet()
        hosts = self.subnet.hosts()
        self.bridge_address = str(next(hosts))
        self._made_links.append(self.bridge)
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self._let_bridged_traffic_through()
        for name in self.names:
            ns = self.namespace(name)
            self.scratch(name).mkdir(parents=True, exist_ok=True)
            self._made_namespaces.append(ns)
            _ip("netns", "add", ns)
            self._made_links.append(ns)  # the veth's root end is named as its namespace
            _ip("link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", ns, "master", self.bridge, "up")
            address = str(next(hosts))
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self._addresses[name] = address
        log.info("hosts %s on %s (bridge %s)", self._addresses, self.subnet, self.bridge)

    def _let_bridged_traffic_through(self) -> None:
        """With bridge-nf-call-iptables on, bridged frames pass iptables' FORWARD chain,
        which a firewall may close; turned off (and back on in ``close``) only where an
        iptables table is loaded at all, so an idle machine's setting is left alone."""
        tables = Path("/proc/net/ip_tables_names")
        if not _BRIDGE_NF.exists() or not tables.exists() or not tables.read_text().strip():
            return
        was = _BRIDGE_NF.read_text().strip()
        if was != "0":
            self._bridge_nf_was = was
            _BRIDGE_NF.write_text("0\n")

    def close(self) -> None:
        """Stop what was started, delete what was made; safe to call again."""
        errors = []
        for proc in list(self.started):
            try:
                self.stop(proc, signal.SIGTERM, timeout=20.0)
            except Exception as e:  # go on: the namespaces must go whatever happened
                errors.append(f"stopping {proc.args!r}: {e}")
        # deleting a veth's root end deletes its pair at once; a namespace's own
        # interfaces are only deleted later, asynchronously, after `ip netns del`
        while self._made_links:
            _ip_quietly("link", "del", self._made_links.pop())
        while self._made_namespaces:
            _ip_quietly("netns", "del", self._made_namespaces.pop())
        if self._bridge_nf_was is not None:
            _BRIDGE_NF.write_text(self._bridge_nf_was + "\n")
            self._bridge_nf_was = None
        if errors:
            raise RuntimeError("; ".join(errors))

    # -- what a test asks --------------------------------------------------------

    def namespace(self, name: str) -> str:
        """The network namespace of host ``name`` (also its veth's name on the bridge)."""
        if name not in self.names:
            raise KeyError(f"no host {name!r}; the hosts are {self.names}")
        return f"{self.prefix}-{name}"

    def address(self, name: str) -> str:
        """Host ``name``'s IPv4 address on the bridge's /24."""
        self.namespace(name)
        return self._addresses[name]

    def scratch(self, name: str) -> Path:
        """The folder, seen from the test process, that host ``name`` sees at ``SCRATCH``."""
        self.namespace(name)
        return self.root / "hosts" / name

    # -- processes ---------------------------------------------------------------

    def _wrap(self, name: str, argv: Sequence[str], cwd: Path | str | None) -> list[str]:
        """``argv`` on host ``name``: each step execs the next, so the pid is argv's."""
        script = 'mount --bind "$1" "$2" && cd "$3" && shift 3 && exec "$@"'
        return [
            "ip", "netns", "exec", self.namespace(name),
            "unshare", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh",
            str(self.scratch(name)), str(self.SCRATCH), str(cwd or self.SCRATCH),
            *map(str, argv),
        ]  # fmt: skip

    def start(
        self, name: str, argv: Sequence[str | os.PathLike[str]],
        env: dict[str, str] | None = None, cwd: Path | str | None = None, log: str | None = None,
    ) -> subprocess.Popen:  # fmt: skip
        """Start ``argv`` on host ``name`` in a session of its own; ``env`` is added to
        this process's environment, ``cwd`` is a path as the host sees it (default
        ``SCRATCH``); stdout and stderr go to ``<tmp_path>/logs/<log>.log``."""
        stem = log or f"{name}-{Path(str(argv[0])).name}-{len(self.started)}"
        path = self.root / "logs" / f"{stem}.log"
        with open(path, "ab") as out:
            proc = subprocess.Popen(
                self._wrap(name, [str(a) for a in argv], cwd), env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started.append(proc)
        self._logs[proc.pid] = path
        return proc

    def run(
        self, name: str, argv: Sequence[str | os.PathLike[str]], timeout_s: float = 60.0,
        env: dict[str, str] | None = None, cwd: Path | str | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run a short command on host ``name`` and return its output (text, not checked)."""
        return subprocess.run(
            self._wrap(name, [str(a) for a in argv], cwd), env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip

    def log(self, proc: subprocess.Popen) -> str:
        """What ``proc`` (started by ``start``) wrote so far."""
        return self._logs[proc.pid].read_text(errors="replace")

    def tail(self, proc: subprocess.Popen) -> str:
        """The end of ``proc``'s log, for a failure's message."""
        return self.log(proc)[-_TAIL_CHARS:]

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        """Signal ``proc``'s process group with ``sig``, then SIGKILL it if ``proc`` is
        still up after ``timeout`` s; what is left of the group is killed too. Returns
        the exit code (negative: the signal)."""
        if proc.returncode is None:
            # until ``proc`` is reaped its pid, and so its group's id, cannot be reused
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            if not _exited(proc, timeout):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                _exited(proc, timeout)
            # the children it left behind, while its zombie still holds the group's id
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            wait_for(
                lambda: not _alive_in_group(proc.pid), timeout, f"the group of {proc.args!r} dying"
            )
        return proc.wait(timeout=timeout)

    def kill(self, proc: subprocess.Popen) -> int:
        """SIGKILL ``proc``'s group at once, as a crash would."""
        return self.stop(proc, signal.SIGKILL)

    # -- faults --------------------------------------------------------------------

    def down(self, name: str) -> None:
        """Unplug host ``name``: its bridge port goes down; nothing reaches it, nor leaves."""
        _ip("link", "set", self.namespace(name), "down")

    def up(self, name: str) -> None:
        """Plug host ``name`` back in. The neighbour entries that failed while it was out
        (its own, and the others' for it) are forgotten, or a connect would be refused as
        unreachable until the kernel retries them; a partition's entries are permanent
        and stay."""
        _ip("link", "set", self.namespace(name), "up")
        _ip("-n", self.namespace(name), "neigh", "flush", "dev", "eth0")
        for other in self.names:
            if other != name:
                _ip("-n", self.namespace(other), "neigh", "flush", "to", self.address(name))

    def partition(self, a: str, b: str) -> None:
        """Drop, silently and both ways, the traffic between hosts ``a`` and ``b`` only."""
        if a == b:
            raise ValueError(f"a host cannot be partitioned from itself ({a!r})")
        for here, there in ((a, b), (b, a)):
            _ip("-n", self.namespace(here), "neigh", "replace", self.address(there),
                "lladdr", NOWHERE_MAC, "dev", "eth0", "nud", "permanent")  # fmt: skip

    def heal(self, a: str, b: str) -> None:
        """Undo ``partition(a, b)``: the neighbour entries are learnt afresh by ARP."""
        for here, there in ((a, b), (b, a)):
            _ip_quietly("-n", self.namespace(here), "neigh", "del", self.address(there),
                        "dev", "eth0")  # fmt: skip


def _alive_in_group(group: int) -> list[int]:
    """The processes of ``group`` that have not exited."""
    return [p.pid for p in processes.table().values() if p.group == group and p.state != "Z"]


def _exited(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for ``proc`` to exit without reaping it (WNOWAIT)."""

    def gone() -> bool:
        try:
            return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped already
            return True

    try:
        wait_for(gone, timeout_s, f"{proc.args!r} exiting", interval_s=0.05)
    except AssertionError:
        return False
    return True


# -- the common services ------------------------------------------------------------


def _answers(url: str) -> bool:
    # no proxy: a proxy in the environment cannot reach the bridge's addresses
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


def wait_ready(
    hosts: Hosts, proc: subprocess.Popen, ready: Callable[[], T], what: str, timeout_s: float
) -> T:
    """Poll ``ready()`` until truthy (returned), failing at once if ``proc`` exits, and
    with ``proc``'s log tail in the message either way."""

    def check() -> T:
        if proc.poll() is not None:
            raise AssertionError(
                f"{what}: it exited with {proc.returncode}; its log ends:\n{hosts.tail(proc)}"
            )
        return ready()

    try:
        return wait_for(check, timeout_s, what, interval_s=0.1)
    except AssertionError as e:
        if proc.returncode is not None:  # the message has the log already
            raise
        raise AssertionError(f"{e}; its log ends:\n{hosts.tail(proc)}") from None


def start_scheduler(
    hosts: Hosts, name: str, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> tuple[subprocess.Popen, str]:
    """``dask scheduler`` on host ``name``; returns it and its ``tcp://ip:port`` once its
    scheduler file (``SCRATCH/scheduler.json`` there) names it."""
    file = hosts.scratch(name) / "scheduler.json"
    file.unlink(missing_ok=True)
    proc = hosts.start(
        name,
        [DASK, "scheduler", "--host", hosts.address(name), "--port", "0",
         "--dashboard-address", ":0", "--scheduler-file", hosts.SCRATCH / "scheduler.json"],
        env={"PYTHONPATH": str(TESTS), **(env or {})},  # it unpickles the tests' tasks
        log=f"{name}-scheduler",
    )  # fmt: skip

    def address() -> str | None:
        try:
            return json.loads(file.read_text())["address"]
        except (OSError, ValueError, KeyError):  # not there, or half written
            return None

    return proc, wait_ready(hosts, proc, address, f"the scheduler on {name}", timeout_s)


def start_workers(
    hosts: Hosts, name: str, scheduler_address: str, nworkers: int = 2,
    env: dict[str, str] | None = None, timeout_s: float = 60.0,
) -> subprocess.Popen:  # fmt: skip
    """``dask worker --nworkers N --nthreads 1`` on host ``name`` (its directory and cwd in
    the host's scratch; ``tests/`` on PYTHONPATH), returned once all N registered."""
    proc = hosts.start(
        name,
        [DASK, "worker", scheduler_address, "--nworkers", str(nworkers), "--nthreads", "1",
         "--host", hosts.address(name), "--local-directory", hosts.SCRATCH / "dask"],
        env={"PYTHONPATH": str(TESTS), **(env or {})},
        log=f"{name}-workers",
    )  # fmt: skip
    wait_ready(
        hosts, proc, lambda: hosts.log(proc).count("Registered to:") >= nworkers,
        f"{nworkers} workers on {name} registering", timeout_s,
    )  # fmt: skip
    return proc


def start_moto(
    hosts: Hosts, name: str, port: int = 5000, timeout_s: float = 60.0
) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on host ``name``; returns it and its endpoint URL once it answers."""
    endpoint = f"http://{hosts.address(name)}:{port}"
    proc = hosts.start(
        name, [sys.executable, "-m", "moto.server", "-H", hosts.address(name), "-p", str(port)],
        env={"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
             "AWS_DEFAULT_REGION": "us-east-1"},
        log=f"{name}-moto",
    )  # fmt: skip
    wait_ready(hosts, proc, lambda: _answers(f"{endpoint}/moto-api/"), f"moto on {name}", timeout_s)
    return proc, endpoint

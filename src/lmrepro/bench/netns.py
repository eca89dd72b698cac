"""A private Linux network namespace whose loopback is rate-limited with a token bucket filter.

Used by ``bench/bench_scape_netns.py`` to run gloo workers over a *really* constrained link on
one machine: every byte the workers exchange crosses the namespace's ``lo`` and so its ``tbf``
qdisc. Loopback has a single egress queue, so the configured rate is shared by both directions
(what two workers send to each other at the same time adds up against one bucket).

Only ``127.0.0.1`` exists inside the namespace (IPv6 is switched off on its ``lo``), and its MTU
is set to 1500 so a small bucket (about 1 ms of traffic) can be used: with loopback's 64 KiB MTU
the bucket would have to hold hundreds of KB, and messages that size would pass at memory speed
whenever the link had been idle (a burst, not a rate). Creating a
namespace needs root (``CAP_NET_ADMIN``) and ``ip``/``tc`` from iproute2;
:func:`missing_requirements` says what is missing in words a user can act on.

The command builders (:func:`tbf_command`, :func:`tbf_burst_bytes`, ...) are pure functions
(tested); :class:`ShapedNamespace` runs them.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from types import TracebackType

#: Default loopback MTU on Linux (64 KiB). A token bucket must hold at least one packet, so with
#: this MTU every burst up to a few hundred KB would pass at memory speed after an idle period.
LO_MTU = 65536
#: The MTU the benchmark sets on the namespace's loopback: Ethernet-sized packets, so the bucket
#: can be small (about 1 ms of traffic) and the link behaves like a rate, not like a burst buffer.
SHAPED_MTU = 1500


def namespace_name(pid: int | None = None) -> str:
    """``lmrepro-bench-<pid>``: unique per benchmark process."""
    return f"lmrepro-bench-{os.getpid() if pid is None else pid}"


def find_tool(name: str) -> str | None:
    """Absolute path of an iproute2 tool (``ip``, ``tc``), also looking in the sbin directories
    that are often missing from a non-root ``PATH``."""
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        p = os.path.join(d, name)
        if os.access(p, os.X_OK):
            return p
    return None


def missing_requirements() -> list[str]:
    """Everything that prevents creating a shaped namespace here, as sentences (empty: all set)."""
    problems = []
    if not hasattr(os, "geteuid") or os.name != "posix":
        return ["network namespaces need Linux"]
    if os.geteuid() != 0:
        problems.append("root is required (ip netns add / tc need CAP_NET_ADMIN): run with sudo")
    for tool in ("ip", "tc"):
        if find_tool(tool) is None:
            problems.append(f"'{tool}' not found: install iproute2 (e.g. apt-get install iproute2)")
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        problems.append("this kernel exposes no network namespaces (/proc/self/ns/net missing)")
    return problems


def rate_bits_per_s(rate_mbit: float) -> float:
    """Mbit/s (tc's ``mbit``: 10^6 bits) to bits per second."""
    return float(rate_mbit) * 1e6


def tbf_burst_bytes(rate_mbit: float, burst_ms: float = 1.0, mtu: int = SHAPED_MTU) -> int:
    """Bucket size: ``burst_ms`` worth of tokens at the rate, but at least 4 MTUs of the device
    (a bucket smaller than one packet would drop it)."""
    by_time = rate_bits_per_s(rate_mbit) / 8.0 * burst_ms / 1e3
    return int(max(math.ceil(by_time), 4 * mtu))


def tbf_command(rate_mbit: float, burst_bytes: int, latency_ms: float, dev: str = "lo",
                tc: str = "tc", action: str = "replace") -> list[str]:
    """``tc qdisc <action> dev <dev> root tbf rate <R>mbit burst <B> latency <L>ms``."""
    if rate_mbit <= 0:
        raise ValueError(f"rate_mbit = {rate_mbit!r} must be > 0")
    if burst_bytes <= 0 or latency_ms <= 0:
        raise ValueError("burst_bytes and latency_ms must be > 0")
    if action not in ("add", "replace", "change"):
        raise ValueError(f"action = {action!r} must be add, replace or change")
    return [tc, "qdisc", action, "dev", dev, "root", "tbf", "rate", f"{rate_mbit:g}mbit",
            "burst", str(int(burst_bytes)), "latency", f"{latency_ms:g}ms"]


def netns_exec_prefix(name: str, ip: str = "ip") -> list[str]:
    """``ip netns exec <name>``: prefix a command with it to run it inside the namespace."""
    return [ip, "netns", "exec", name]


class ShapedNamespace:
    """Context manager: create namespace ``name``, bring ``lo`` up (127.0.0.1 only), optionally
    shape it, and delete it on exit (also after an exception or Ctrl-C).

    ``with ShapedNamespace() as ns: ns.shape(100); ns.in_ns([...])``. While inside, SIGTERM
    and SIGINT (also where the launcher had SIGINT ignored) raise ``KeyboardInterrupt``, so a
    benchmark stopped with Ctrl-C or ``kill`` still removes its namespace.
    """

    def __init__(self, name: str | None = None, latency_ms: float = 200.0,
                 mtu: int = SHAPED_MTU) -> None:
        self.name = name or namespace_name()
        self.latency_ms = latency_ms
        self.mtu = mtu
        self.ip = find_tool("ip") or "ip"
        self.tc = find_tool("tc") or "tc"
        self.created = False
        self.rate_mbit: float | None = None
        self._old_handlers: dict[int, object] = {}

    # -- commands ----------------------------------------------------------------------------
    def _run(self, cmd: Sequence[str]) -> str:
        proc = subprocess.run(list(cmd), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n"
                               f"{proc.stderr.strip()}")
        return proc.stdout

    def exec_prefix(self) -> list[str]:
        return netns_exec_prefix(self.name, self.ip)

    def in_ns(self, cmd: Sequence[str]) -> str:
        """Run ``cmd`` inside the namespace; returns its stdout."""
        return self._run([*self.exec_prefix(), *cmd])

    def shape(self, rate_mbit: float | None, burst_ms: float = 1.0) -> list[str] | None:
        """Limit ``lo`` to ``rate_mbit`` (None: remove the limit). Returns the tc command run."""
        if rate_mbit is None:
            if self.rate_mbit is not None:
                self.in_ns([self.tc, "qdisc", "del", "dev", "lo", "root"])
            self.rate_mbit = None
            return None
        cmd = tbf_command(rate_mbit, tbf_burst_bytes(rate_mbit, burst_ms, self.mtu),
                          self.latency_ms,
                          tc=self.tc, action="replace")
        self.in_ns(cmd)
        self.rate_mbit = rate_mbit
        return cmd

    def qdisc(self) -> str:
        return self.in_ns([self.tc, "qdisc", "show", "dev", "lo"]).strip()

    def addresses(self) -> str:
        return self.in_ns([self.ip, "-o", "addr", "show"]).strip()

    # -- lifetime ----------------------------------------------------------------------------
    def create(self) -> None:
        problems = missing_requirements()
        if problems:
            raise RuntimeError("cannot create a network namespace: " + "; ".join(problems))
        self._run([self.ip, "netns", "add", self.name])
        self.created = True
        self.in_ns([self.ip, "link", "set", "lo", "mtu", str(self.mtu), "up"])
        # 127.0.0.1 only: no IPv6 on the namespace's loopback (ignored if IPv6 is compiled out).
        subprocess.run([*self.exec_prefix(), "sysctl", "-q", "-w",
                        "net.ipv6.conf.lo.disable_ipv6=1"], capture_output=True)

    def pids(self) -> list[int]:
        """Processes still running inside the namespace (``ip netns pids``)."""
        out = subprocess.run([self.ip, "netns", "pids", self.name], capture_output=True,
                             text=True).stdout
        return [int(x) for x in out.split() if x.isdigit()]

    def delete(self) -> None:
        """Kill what this benchmark left inside the namespace (by pid), then delete it."""
        if self.created:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run([self.ip, "netns", "del", self.name], capture_output=True)
            self.created = False

    def __enter__(self) -> ShapedNamespace:
        def _term(signum: int, frame: object) -> None:
            raise KeyboardInterrupt(f"signal {signum}")

        for sig, handler in ((signal.SIGTERM, _term), (signal.SIGINT, signal.default_int_handler)):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except ValueError:      # not the main thread: leave signals alone
                break
        try:
            self.create()
        except BaseException:
            self.delete()
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old_handlers.clear()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self.delete()
        finally:
            self._restore()

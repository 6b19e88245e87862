"""What one phase of the fleet benchmark cost, read from the programs themselves: the API server's
audit log (writes by user, verb and kind) and its request-latency histogram, /proc (each
process's CPU seconds and peak memory) and the hook service's one log line per call."""

import json
import os
import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.bench.throughput import percentile
from tests.support.metacontroller import USER as METACONTROLLER_USER

# The loopback control plane's processes, by executable name, whose CPU a phase reports.
CONTROL_PLANE = (
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok-controller",
    "lws-controller",
)
TICK = os.sysconf("SC_CLK_TCK")
# Watches and proxied connections last as long as the client wants: not request latency.
LONG_RUNNING = {"WATCH", "CONNECT"}
BUCKET = re.compile(r"^apiserver_request_duration_seconds_bucket\{(?P<labels>[^}]*)\} (?P<count>\S+)$")


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, its reaped children (a gunicorn worker that was replaced) and
    its live children."""
    fields = _stat(pid)
    ticks = sum(int(value) for value in fields[11:15])
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for child in children:
        ticks += sum(int(value) for value in _stat(int(child))[11:13])
    return ticks / TICK


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory since start or the last reset_peak."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def control_plane_pids() -> dict[str, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                executable = Path((entry / "cmdline").read_bytes().split(b"\0")[0].decode()).name
            except (OSError, UnicodeDecodeError):
                continue
            if executable in CONTROL_PLANE:
                found[executable] = int(entry.name)
    return found


def latency_histogram(admin: httpx.Client) -> Counter:
    """The API server's cumulative request-duration buckets over every verb but watches: le -> count."""
    buckets: Counter = Counter()
    for line in admin.get("/metrics").text.splitlines():
        if match := BUCKET.match(line):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if labels.get("verb") not in LONG_RUNNING:
                buckets[float(labels["le"])] += float(match["count"])
    return buckets


def histogram_quantile(quantile: float, buckets: Counter) -> float:
    """As Prometheus's histogram_quantile: linear within the bucket the rank falls in."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0
    if not total:
        return 0.0
    rank, lower, below = quantile * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-9)
        lower, below = bound, buckets[bound]
    return lower


@dataclass
class Figures:
    """One phase's figures."""

    phase: str
    seconds: float
    metacontroller_writes: Counter  # "verb kind" -> count
    other_writes: int
    metacontroller_errors: int  # lines its log logged at level error (a sync that failed)
    cpu: dict[str, float]  # process -> CPU seconds
    metacontroller_peak_mb: float
    hook_peak_mb: float  # the largest gunicorn worker's
    hook_calls: Counter  # hook -> calls
    hook_ms: list[float] = field(repr=False)
    api_p50_ms: float = 0.0
    api_p99_ms: float = 0.0


def audit_writes(audit_log: Path, start: int, end: int) -> tuple[Counter, int]:
    by_verb_kind: Counter = Counter()
    others = 0
    with audit_log.open("rb") as log:
        log.seek(start)
        for line in log.read(end - start).splitlines():
            event = json.loads(line)
            if event["stage"] != "ResponseComplete" or event.get("responseStatus", {}).get("code", 200) >= 300:
                continue
            if event["user"]["username"] != METACONTROLLER_USER:
                others += 1
                continue
            ref = event.get("objectRef", {})
            kind = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            by_verb_kind[f"{event['verb']} {kind}"] += 1
    return by_verb_kind, others


def hook_calls(log_path: Path, start: int, end: int) -> tuple[Counter, list[float]]:
    calls: Counter = Counter()
    durations = []
    with log_path.open("rb") as log:
        log.seek(start)
        for line in log.read(end - start).splitlines():
            if line.startswith(b"{") and b'"duration_ms"' in line:
                record = json.loads(line)
                calls[record["hook"]] += 1
                durations.append(record["duration_ms"])
    return calls, durations


def error_lines(log_path: Path, start: int) -> int:
    with log_path.open("rb") as log:
        log.seek(start)
        return sum(1 for line in log if line.startswith(b'{"level":"error"'))


class Meter:
    """Measures from start() to stop(): call start, run the phase, call stop."""

    def __init__(
        self, admin: httpx.Client, audit_log: Path, hook_log: Path, hook_pid: int, metacontroller_log: Path
    ) -> None:
        self.admin = admin
        self.metacontroller_log = metacontroller_log
        self.audit_log = audit_log
        self.hook_log = hook_log
        self.hook_pid = hook_pid
        self.metacontroller_pid = 0

    def start(self, metacontroller_pid: int) -> None:
        self.metacontroller_pid = metacontroller_pid
        self.started = time.monotonic()
        self.audit_offset = self.audit_log.stat().st_size
        self.hook_offset = self.hook_log.stat().st_size
        self.metacontroller_log_offset = self.metacontroller_log.stat().st_size
        self.cpu_before = self._cpu()
        self.latency_before = latency_histogram(self.admin)
        for pid in [metacontroller_pid, *self._hook_workers()]:
            reset_peak(pid)

    def _hook_workers(self) -> list[int]:
        return [int(pid) for pid in Path(f"/proc/{self.hook_pid}/task/{self.hook_pid}/children").read_text().split()]

    def restarted(self, metacontroller_pid: int, old_cpu_seconds: float) -> None:
        """Metacontroller was replaced mid-phase: the phase counts the old process's CPU up to
        `old_cpu_seconds` (read just before it stopped) and the new one's from its start."""
        self.cpu_before["metacontroller"] -= old_cpu_seconds
        self.metacontroller_pid = metacontroller_pid
        reset_peak(metacontroller_pid)

    def stop(self, phase: str, ended: float | None = None) -> Figures:
        """The figures since start(); `ended` (monotonic) when the phase converged before now."""
        seconds = (ended or time.monotonic()) - self.started
        time.sleep(1)  # the audit backend writes its last events a moment after the response
        now = self._cpu()
        cpu = {name: now[name] - before for name, before in self.cpu_before.items()}
        writes, others = audit_writes(self.audit_log, self.audit_offset, self.audit_log.stat().st_size)
        calls, durations = hook_calls(self.hook_log, self.hook_offset, self.hook_log.stat().st_size)
        latency = latency_histogram(self.admin)
        latency.subtract(self.latency_before)
        return Figures(
            phase,
            seconds,
            writes,
            others,
            error_lines(self.metacontroller_log, self.metacontroller_log_offset),
            cpu,
            peak_rss_mb(self.metacontroller_pid),
            max(map(peak_rss_mb, self._hook_workers()), default=0.0),
            calls,
            durations,
            histogram_quantile(0.5, latency) * 1000,
            histogram_quantile(0.99, latency) * 1000,
        )

    def _cpu(self) -> dict[str, float]:
        cpu = {name: tree_cpu_seconds(pid) for name, pid in control_plane_pids().items()}
        cpu["metacontroller"] = tree_cpu_seconds(self.metacontroller_pid)
        cpu["hooks"] = tree_cpu_seconds(self.hook_pid)
        return cpu


def latency_ms(durations: list[float]) -> tuple[float, float]:
    """p50 and p99 of the hook's own durations."""
    if not durations:
        return 0.0, 0.0
    return statistics.median(durations), percentile(durations, 0.99)

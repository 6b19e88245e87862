"""The hook service survives its own failures, hostile specs and slow clients: each test runs a
real `infera-hooks serve` on loopback and stops every process it starts by PID."""

import json
import os
import re
import resource
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.support.graphs import graph
from tests.support.prerequisites import need
from tests.support.requests import PD, big_graph, children_by_key, parent, request_body
from tests.support.service import HookClient, RunningServer, read_reply, running_server, scrape, stop_process


def pd_body() -> bytes:
    return json.dumps(request_body(parent(PD))).encode()


def wait_for(condition, seconds: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def replace_a_worker(server: RunningServer, sig: signal.Signals) -> None:
    """Kill one gunicorn worker and wait until the master has replaced it."""
    before = server.workers()
    victim = before[0]
    os.kill(victim, sig)
    wait_for(
        lambda: victim not in server.workers() and len(server.workers()) == len(before), what="a replacement worker"
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_die_and_are_replaced_any_number_of_times(tmp_path: Path, workers: int) -> None:
    with running_server(tmp_path, workers=workers) as server:
        client = HookClient(server.url)
        for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGTERM):
            replace_a_worker(server, sig)
            # Every worker, old or new, answers: with two workers, enough calls reach both.
            for _ in range(4 * workers):
                assert client.request("POST", "/sync", pd_body()).status == 200
                assert client.request("GET", "/metrics").status == 200
                assert client.request("GET", "/readyz").status == 200
        metrics = client.request("GET", "/metrics").body.decode()
        assert 'infera_hook_requests_total{hook="sync",outcome="ok"}' in metrics


def a_booting_worker(server: RunningServer) -> int:
    """SIGKILL the one worker; the replacement the master forks, as soon as it exists (still
    booting: it has not yet installed its own signal handlers)."""
    (old,) = server.workers()
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (workers := server.workers()) in ([], [old]):
        assert time.monotonic() < deadline, "timed out waiting for the master to fork a worker"
        time.sleep(0.001)
    (new,) = workers
    return new


def test_a_worker_told_to_stop_while_it_boots_stops(tmp_path: Path) -> None:
    from hooks.server import GRACEFUL_TIMEOUT_SECONDS

    # A signal that arrived between the fork and the worker's own handlers used to be lost: the
    # worker served on, never replaced, and stopping the master waited out the graceful timeout
    # for it (the rare failure of test_workers_die_and_are_replaced_any_number_of_times).
    with running_server(tmp_path, workers=1) as server:
        booting = a_booting_worker(server)
        os.kill(booting, signal.SIGTERM)
        wait_for(
            lambda: booting not in server.workers() and len(server.workers()) == 1,
            GRACEFUL_TIMEOUT_SECONDS / 2,
            "the booting worker to stop and be replaced",
        )
        assert HookClient(server.url).request("POST", "/sync", pd_body()).status == 200
        # The master's SIGTERM (a pod's deletion) reaches a booting worker the same way.
        a_booting_worker(server)
        started = time.monotonic()
        stop_process(server.process)
        elapsed = time.monotonic() - started
    assert elapsed < GRACEFUL_TIMEOUT_SECONDS / 2, f"the master took {elapsed:.1f} s to stop"


def test_probes_fail_when_the_service_cannot_record_metrics(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with running_server(tmp_path, workers=1, env={"TMPDIR": str(scratch)}) as server:
        client = HookClient(server.url)
        (metrics_dir,) = scratch.glob("infera-hooks-metrics-*")
        assert client.request("GET", "/healthz").json == {"status": "ok"}
        shutil.rmtree(metrics_dir)
        for path in ("/healthz", "/readyz"):
            reply = client.request("GET", path)
            assert reply.status == 503
            assert reply.json["reason"] == "the metrics directory (PROMETHEUS_MULTIPROC_DIR) is missing or not writable"
    # The master removes the directory it made, once, at exit; workers never do.
    assert list(scratch.iterdir()) == []


def test_readyz_fails_when_a_known_good_graph_does_not_render(monkeypatch: pytest.MonkeyPatch) -> None:
    from hooks import app as app_module
    from hooks import render

    client = app_module.create_app().test_client()
    assert client.get("/readyz").json == {"status": "ready"}
    monkeypatch.setattr(render, "render_children", lambda *arguments: [][0])
    reply = client.get("/readyz")
    assert reply.status_code == 503
    assert reply.json == {
        "status": "not ready",
        "reason": "a known-good graph renders as failed: internal error while rendering (IndexError); the hook's log "
        "has the details",
    }
    # Liveness only asks whether this process can serve at all: a restart would not fix a bug.
    assert client.get("/healthz").status_code == 200


def plane_children() -> list[dict]:
    """The children left for the last teardown step: the NATS broker and discovery identity."""
    from hooks import reconcile
    from hooks.contract import parse_request

    answer = reconcile.sync(parse_request(request_body(parent(PD))))
    return [
        child
        for child in answer["children"]
        if child["metadata"]["labels"]["infera.amd.com/service"] in ("nats", "disc")
    ]


def test_a_finalize_that_waits_on_the_clock_is_never_answered_from_the_cache(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    # A worker pod past its deletion deadline by 58-59 s, under the stuck-pod slack (60 s): still
    # draining now, stuck (and no longer waited for) 2.1 s later. Same request both times.
    def finalize_body() -> dict:
        deadline = (datetime.now(UTC) - timedelta(seconds=58)).strftime("%Y-%m-%dT%H:%M:%SZ")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "qwen-pd-prefill-0",
                "namespace": "default",
                "deletionTimestamp": deadline,
                "labels": {"infera.amd.com/deployment": "qwen-pd", "infera.amd.com/component": "worker"},
            },
        }
        body = request_body(parent(PD), plane_children())
        body["finalizing"] = True
        body["parent"]["metadata"]["deletionTimestamp"] = deadline
        body["related"] = {"Pod.v1": {"default/qwen-pd-prefill-0": pod}}
        return body

    with running_server(tmp_path, workers=1) as server:
        client = HookClient(server.url)
        body = finalize_body()
        first = client.post("/finalize", body)
        assert first.status == 200 and "ETag" not in first.headers
        assert first.json["status"]["message"] == "waiting for 1 worker pods to finish draining: qwen-pd-prefill-0"
        assert first.json["resyncAfterSeconds"] == 5
        time.sleep(2.1)
        second = client.request("POST", "/finalize", json.dumps(body).encode())
        assert second.status == 200
        assert second.json["status"]["message"] == (
            "removing the NATS broker and the pods' accounts (9 objects); "
            "1 worker pods did not finish draining in time and are left behind: qwen-pd-prefill-0"
        )
        assert second.json["children"] == []


def peak_rss_mib(pid: int) -> float:
    """The most resident memory the process has had (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def with_patches(*patches: dict) -> dict:
    return graph().patches(*patches).obj()


DOUBLING_BOMB = {
    "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
    # Each copy appends the whole list to itself: 2^99 items if nothing stopped it.
    "patch": [{"op": "add", "path": "/spec/x", "value": ["payload"]}]
    + [{"op": "copy", "from": "/spec/x", "path": "/spec/x/-"}] * 99,
}


def test_a_doubling_patch_bomb_fails_fast_in_bounded_memory(tmp_path: Path) -> None:
    with running_server(tmp_path, workers=1) as server:
        client = HookClient(server.url)
        (worker,) = server.workers()
        client.request("POST", "/sync", pd_body())  # warm: imports and caches
        baseline = peak_rss_mib(worker)
        started = time.monotonic()
        answer = client.hook("/sync", request_body(with_patches(DOUBLING_BOMB)))
        elapsed = time.monotonic() - started
        assert answer["status"]["state"] == "failed"
        assert answer["status"]["message"] == (
            "patches[0] (Deployment qwen-pd-decode): operation 17 (copy /spec/x/-): Deployment qwen-pd-decode could "
            "grow to 1,575,566 bytes; the API server stores at most 1,572,864 bytes (1.5 MiB) per object: shorten "
            "what the spec puts in it (envs, args, extraPodSpec, patches)"
        )
        assert answer["children"] == []  # nothing was observed, so nothing is kept or created
        assert elapsed < 1.0, f"the bomb took {elapsed:.2f} s"
        assert peak_rss_mib(worker) - baseline < 64, "a bounded answer must not need much memory"
        assert client.request("GET", "/readyz").status == 200


def test_the_most_patch_operations_allowed_apply_quickly_and_more_are_refused(hooks: HookClient) -> None:
    annotate = [{"op": "add", "path": "/metadata/annotations", "value": {}}]
    patches = [
        {
            "target": {"kind": "Deployment", "name": "qwen-pd-decode"},
            "patch": (annotate if p == 0 else [])
            + [
                # Every operation rewrites one annotation, so the child stays small enough for
                # Metacontroller's record while all 10,000 operations still run in order.
                {"op": "add", "path": "/metadata/annotations/example.com~1patched", "value": f"{p}-{i}"}
                for i in range(100 - (p == 0))
            ],
        }
        for p in range(100)
    ]
    answer = hooks.hook("/sync", request_body(with_patches(*patches)))
    assert answer["status"]["state"] == "initializing"
    decode = children_by_key(answer)[("Deployment", "qwen-pd-decode")]
    assert decode["metadata"]["annotations"]["example.com/patched"] == "99-99"

    refused = hooks.hook("/sync", request_body(with_patches(*patches, patches[1])))
    assert (
        refused["status"]["message"]
        == "invalid spec: spec.patches: List should have at most 100 items after validation, not 101"
    )
    too_long = dict(patches[1], patch=patches[1]["patch"] * 2)
    refused = hooks.hook("/sync", request_body(with_patches(too_long)))
    assert refused["status"]["message"] == (
        "invalid spec: spec.patches.0.patch: List should have at most 100 items after validation, not 200"
    )


def metrics_directory(scratch: Path) -> Path:
    (directory,) = scratch.glob("infera-hooks-metrics-*")
    return directory


def stored_bytes(directory: Path) -> int:
    """What the files take in memory on a tmpfs: allocated blocks, not apparent sizes."""
    return sum(path.stat().st_blocks * 512 for path in directory.iterdir())


def test_dead_workers_counts_are_kept_in_one_file_per_type(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with running_server(tmp_path, workers=2, env={"TMPDIR": str(scratch)}) as server:
        client = HookClient(server.url)
        calls = 0
        for sig in (signal.SIGKILL, signal.SIGTERM) * 3:
            for _ in range(3):
                assert client.request("POST", "/sync", pd_body()).status == 200
                calls += 1
            replace_a_worker(server, sig)
        samples = scrape(client)
        files = sorted(path.name for path in metrics_directory(scratch).glob("*.db"))
    # Six workers died: their counts are all there, in one merged file per type.
    assert samples['infera_hook_requests_total{hook="sync",outcome="ok"}'] == calls == 18
    assert samples['infera_hook_duration_seconds_count{hook="sync",outcome="ok"}'] == 18
    assert [name for name in files if not name.split("_")[1].split(".")[0].isdigit()] == [
        "counter_merged.db",
        "histogram_merged.db",
    ]
    assert len(files) <= 2 + 2 * 2  # plus the live workers' own


def test_a_directory_left_by_a_killed_master_is_removed_at_start(tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    (scratch / "infera-hooks-metrics-999999999-abcdef").mkdir(parents=True)  # no such process
    (scratch / f"infera-hooks-metrics-{os.getpid()}-abcdef").mkdir()  # this test: still running
    with running_server(tmp_path, workers=1, env={"TMPDIR": str(scratch)}) as server:
        names = sorted(path.name for path in scratch.iterdir())
    (own,) = [name for name in names if name.startswith(f"infera-hooks-metrics-{server.process.pid}-")]
    assert names == sorted([f"infera-hooks-metrics-{os.getpid()}-abcdef", own])


FLEET = 10_000
# The pod's /tmp is a 16 Mi in-memory volume; the metrics must leave most of it free.
METRICS_BUDGET_BYTES = 4 * 1024 * 1024


def small_graph(index: int) -> dict:
    """A distinct two-service InferaDeployment: namespace and name as long as real ones get."""
    from hooks.app import READINESS_PROBE_REQUEST

    obj = json.loads(json.dumps(READINESS_PROBE_REQUEST["parent"]))
    del obj["spec"]["patches"]  # they name the probe's own children
    obj["metadata"] = {
        "name": f"inference-graph-{index:05d}-qwen3-0-6b",
        "namespace": f"team-{index % 100:03d}-inference",
        "generation": 1,
        "uid": f"uid-{index}",
    }
    if index % 3 == 0:
        obj["spec"]["backendFramework"] = "tensorrt"  # failed: a state too
    return obj


def test_ten_thousand_inferadeployments_stay_within_the_metrics_budget(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with running_server(tmp_path, workers=2, env={"TMPDIR": str(scratch)}) as server:
        client = HookClient(server.url)

        def call(path: str, index: int) -> int:
            body = {"parent": small_graph(index), "children": {}}
            if path == "/finalize":
                body["finalizing"] = True
                body["parent"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            return client.request("POST", path, json.dumps(body).encode()).status

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(lambda i: call("/sync", i), range(FLEET))) == {200}
            directory = metrics_directory(scratch)
            used = stored_bytes(directory)
            assert used <= METRICS_BUDGET_BYTES, f"{used:,} bytes for {FLEET:,} InferaDeployments"
            assert set(pool.map(lambda i: call("/finalize", i), range(FLEET))) == {200}
        # No series per InferaDeployment: kube-state-metrics exports their states.
        assert [name for name in scrape(client) if "inference-graph" in name] == []
        assert stored_bytes(directory) <= METRICS_BUDGET_BYTES
        assert client.request("GET", "/healthz").status == 200


def raw_connection(server: RunningServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def sync_head(length: int) -> bytes:
    return f"POST /sync HTTP/1.1\r\nHost: hooks\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode()


def test_trickling_clients_starve_neither_hooks_nor_probes(tmp_path: Path) -> None:
    body = pd_body()
    with running_server(tmp_path, "--client-timeout", "3", workers=2) as server:
        client = HookClient(server.url)
        tricklers = [raw_connection(server) for _ in range(16)]
        stop = threading.Event()

        def trickle(index: int, connection: socket.socket) -> None:
            # Half send their headers a byte at a time, half their body.
            data = sync_head(len(body)) + body if index % 2 else sync_head(len(body))[:-2] + b"X-Slow: " + b"a" * 200
            start = 0 if index % 2 == 0 else len(sync_head(len(body)))
            if start:
                connection.sendall(data[:start])
            for offset in range(start, len(data)):
                if stop.wait(0.1):
                    return
                try:
                    connection.sendall(data[offset : offset + 1])
                except OSError:
                    return  # disconnected by the server: what a deadline does

        threads = [threading.Thread(target=trickle, args=item, daemon=True) for item in enumerate(tricklers)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.5)  # every trickler connected and sending
            slowest = 0.0
            for _ in range(20):
                for path, data in (("/sync", body), ("/healthz", None)):
                    started = time.monotonic()
                    reply = client.request("POST" if data else "GET", path, data)
                    slowest = max(slowest, time.monotonic() - started)
                    assert reply.status == 200
            assert slowest < 1.0, f"a call took {slowest:.2f} s next to 16 trickling clients"
            # Deadlines: bodies get 408 after --client-timeout; headers, the keep-alive timeout (5 s).
            answers = [read_reply(connection) for connection in tricklers]
        finally:
            stop.set()
            for connection in tricklers:
                connection.close()
    for index, answer in enumerate(answers):
        if index % 2:
            assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
            assert answer.endswith(b'{"error": "the request body did not arrive within 3 s"}')
        else:
            assert answer == b"", answer


def open_files_for(needed: int) -> None:
    """Let this process (and the servers it starts, which inherit it) hold `needed` files."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        need(
            hard == resource.RLIM_INFINITY or hard >= needed,
            f"holding the connections takes {needed} open files; the hard limit (ulimit -Hn) is {hard}",
        )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def test_each_connection_carries_one_request_and_is_closed_after_its_answer(tmp_path: Path) -> None:
    """No connection is left idle for a client to reuse as the server closes it (Go's client,
    Metacontroller's, keeps idle connections for 90 s and would meet that close with a broken
    pipe): the answer says `Connection: close`, and a second request on it is never read."""
    body = pd_body()
    with running_server(tmp_path, workers=1) as server:
        for request in (sync_head(len(body)) + body, b"GET /healthz HTTP/1.1\r\nHost: hooks\r\n\r\n"):
            connection = raw_connection(server)
            try:
                connection.sendall(request + b"GET /healthz HTTP/1.1\r\nHost: hooks\r\n\r\n")  # a second, pipelined
                answer = read_reply(connection)
                assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
                assert b"\r\nConnection: close\r\n" in answer.partition(b"\r\n\r\n")[0], answer[:400]
                assert read_reply(connection) == b""  # closed: the second request got no answer
            finally:
                connection.close()


def test_clients_that_send_nothing_never_keep_the_probes_out(tmp_path: Path) -> None:
    from hooks.server import WORKER_CONNECTIONS

    held = 400
    open_files_for(2 * held + 256)  # the client's sockets, the server's, and what both have open already
    with running_server(tmp_path, workers=2) as server:
        client = HookClient(server.url)
        connections: list[socket.socket] = []
        try:
            for _ in range(held):
                # Each has begun its request and stops before its headers are done.
                connections.append(raw_connection(server))
                connections[-1].sendall(b"GET /healthz HTTP/1.1\r\n")
            for _ in range(5):
                for path in ("/healthz", "/readyz"):
                    started = time.monotonic()
                    reply = client.request("GET", path)
                    elapsed = time.monotonic() - started
                    assert reply.status == 200, reply.body
                    # The kubelet's default probe timeout.
                    assert elapsed < 1.0, f"{path} took {elapsed:.2f} s next to {held} waiting connections"
            # The workers made room by closing the connections waiting longest, as their keep-alive
            # timeout (the headers' deadline) would.
            closed = 0
            for connection in connections:
                connection.settimeout(0.01)
                try:
                    closed += connection.recv(1) == b""
                except TimeoutError:
                    pass
            assert closed >= held - 2 * WORKER_CONNECTIONS
        finally:
            for connection in connections:
                connection.close()


def test_bodies_sent_slowly_take_the_body_budget_only_as_they_arrive(tmp_path: Path) -> None:
    from hooks.body import READ_CHUNK_BYTES, SMALL_BODIES_BYTES, SMALL_BODY_BYTES
    from hooks.server import WORKER_CONNECTIONS

    # Each holds the chunk it awaits: a worker's every connection doing so leaves room for a body.
    assert WORKER_CONNECTIONS * READ_CHUNK_BYTES + SMALL_BODY_BYTES <= SMALL_BODIES_BYTES
    body = pd_body()
    with running_server(tmp_path, "--client-timeout", "6", workers=2) as server:
        client = HookClient(server.url)
        # Each declares 1 MiB, as much as a body may within the budget of normal calls, and sends a byte every 0.5 s.
        tricklers = [raw_connection(server) for _ in range(20)]
        for connection in tricklers:
            connection.sendall(sync_head(SMALL_BODY_BYTES) + b"{")
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(0.5):
                for connection in tricklers:
                    try:
                        connection.sendall(b" ")
                    except OSError:
                        pass  # answered and closed

        thread = threading.Thread(target=trickle, daemon=True)
        thread.start()
        try:
            time.sleep(0.5)  # every trickler's body begun
            statuses: dict[int, int] = {}
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                status = client.request("POST", "/sync", body).status
                statuses[status] = statuses.get(status, 0) + 1
            assert set(statuses) == {200}, statuses
            answers = [read_reply(connection) for connection in tricklers]
        finally:
            stop.set()
            thread.join()
            for connection in tricklers:
                connection.close()
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer[:100]


def test_bodies_that_arrived_are_bounded_by_the_budget(tmp_path: Path) -> None:
    from hooks.body import SMALL_BODIES_BYTES, SMALL_BODY_BYTES

    with running_server(tmp_path, "--client-timeout", "5", workers=1) as server:
        client = HookClient(server.url)
        # Bodies of 1 MiB arrive whole but for their last byte: eight take the whole budget.
        held = [raw_connection(server) for _ in range(SMALL_BODIES_BYTES // SMALL_BODY_BYTES)]
        for connection in held:
            connection.sendall(sync_head(SMALL_BODY_BYTES) + b'"' + b"x" * (SMALL_BODY_BYTES - 2))
        try:
            wait_for(lambda: client.request("POST", "/sync", pd_body()).status == 503, 5, "a full budget")
            late = raw_connection(server)
            late.sendall(sync_head(SMALL_BODY_BYTES) + b'"' + b"x" * (SMALL_BODY_BYTES - 2) + b'"')
            assert read_reply(late).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
            for connection in held:
                connection.sendall(b'"')  # the last byte: a whole JSON string, read, and no hook request
                assert read_reply(connection).startswith(b"HTTP/1.1 400 BAD REQUEST\r\n")
            assert client.request("POST", "/sync", pd_body()).status == 200
        finally:
            for connection in held:
                connection.close()


def test_large_bodies_in_flight_are_bounded_and_never_block_normal_calls(tmp_path: Path) -> None:
    limit = 4_000_000
    with running_server(tmp_path, "--client-timeout", "2", "--max-request-bytes", str(limit), workers=1) as server:
        stalled = raw_connection(server)
        stalled.sendall(sync_head(limit) + b"{" + b" " * (limit - 2))  # all but its last byte
        time.sleep(0.3)
        # One maximum-size body at a time: the next large one is turned away at once...
        second = raw_connection(server)
        second.sendall(sync_head(limit))
        assert read_reply(second).startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        # ...while a normal call, with a budget of its own, goes through.
        assert HookClient(server.url).request("POST", "/sync", pd_body()).status == 200
        assert read_reply(stalled).startswith(b"HTTP/1.1 408 ")
        samples = scrape(HookClient(server.url))
    assert samples['infera_hook_requests_total{hook="sync",outcome="busy"}'] == 1
    assert samples['infera_hook_requests_total{hook="sync",outcome="timeout"}'] == 1


def test_an_unauthenticated_body_is_refused_unread(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    with running_server(tmp_path, "--auth-token-file", str(token), "--client-timeout", "30", workers=1) as server:
        connection = raw_connection(server)
        connection.sendall(sync_head(1_000_000) + b"{")  # and nothing more
        started = time.monotonic()
        assert read_reply(connection).startswith(b"HTTP/1.1 401 ")
        assert time.monotonic() - started < 5  # not after the 30 s body deadline


def test_a_client_that_does_not_read_its_answer_is_disconnected(tmp_path: Path) -> None:

    graph = big_graph(200)
    for service in graph["spec"]["services"].values():  # a 6 MB answer: more than the kernel buffers
        service["podAnnotations"] = {"example.com/note": "x" * 30_000}
    body = json.dumps(request_body(graph)).encode()
    with running_server(tmp_path, "--client-timeout", "2", workers=1) as server:
        host, port = server.url.removeprefix("http://").split(":")
        connection = socket.socket()
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the answer cannot all fit
        connection.connect((host, int(port)))
        connection.sendall(sync_head(len(body)) + body)
        time.sleep(4)  # not reading: the server's send blocks, then gives up
        received = read_reply(connection)
        declared = int(re.search(rb"(?i)content-length: *(\d+)", received).group(1))
        assert len(received.partition(b"\r\n\r\n")[2]) < declared  # cut off, not delivered late
        assert HookClient(server.url).request("GET", "/healthz").status == 200

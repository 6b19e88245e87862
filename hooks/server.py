"""`infera-hooks serve`: the hook app under gunicorn, with gevent workers.

A sync worker is held by one connection from its first byte to its last, so a few clients
sending slowly (or not at all) would leave nothing to answer Metacontroller or the kubelet's
probes. A gevent worker waits on sockets cooperatively: slow connections cost a greenlet each,
and deadlines bound how long they may take:

- request line and headers: gunicorn's keep-alive timeout (the connection is closed);
- the body: `read_timeout` seconds from the first byte of it (408).

Reading a body whole before the app sees it also bounds memory: each worker buffers at most
BODIES_IN_FLIGHT maximum-size bodies at once, and turns further ones away with 503.
"""

import io
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hooks import kubernetes_schema, metrics_dir
from hooks.auth import TokenFile

log = logging.getLogger("hooks")
# Two maximum-size bodies at once per worker: a real request is tens of kilobytes, so the
# budget only ever turns away a flood of huge ones.
BODIES_IN_FLIGHT = 2
READ_CHUNK_BYTES = 64 * 1024
# On SIGTERM, hook calls in flight get this long to finish before the workers exit.
GRACEFUL_TIMEOUT_SECONDS = 20

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict, StartResponse], Iterable[bytes]]


@dataclass(frozen=True)
class ServeOptions:
    bind: str
    workers: int
    timeout: int
    read_timeout: float
    max_request_bytes: int
    auth: TokenFile | None
    certfile: str | None
    keyfile: str | None


def _plain_error(start_response: StartResponse, status: str, message: str) -> list[bytes]:
    body = json.dumps({"error": message}).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


class BufferedBody:
    """WSGI middleware: read the request body whole, within a deadline and a byte budget,
    before the app runs (the app then never waits on a client)."""

    def __init__(self, app: WsgiApp, max_request_bytes: int, read_timeout: float) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.read_timeout = read_timeout
        self.budget = BODIES_IN_FLIGHT * max_request_bytes

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        declared = environ.get("CONTENT_LENGTH") or ""
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if not chunked and (not declared.isdigit() or not 0 < int(declared) <= self.max_request_bytes):
            # No body, or one too large: the app answers (413) without reading it.
            return self.app(environ, start_response)
        # A chunked body's size is known only once read: reserve the most the app accepts, and
        # one byte more to show that a body is larger (the app then answers 413).
        reserved = self.max_request_bytes + 1 if chunked else int(declared)
        if reserved > self.budget:
            return _plain_error(start_response, "503 Service Unavailable", "too many large requests at once: retry")
        self.budget -= reserved
        try:
            body = self._read(environ["wsgi.input"], reserved)
        finally:
            self.budget += reserved
        if body is None:
            log.warning("no complete request body on %s within %g s", environ.get("PATH_INFO"), self.read_timeout)
            message = f"the request body did not arrive within {self.read_timeout:g} s"
            return _plain_error(start_response, "408 Request Timeout", message)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        return self.app(environ, start_response)

    def _read(self, stream: Any, limit: int) -> bytes | None:
        """Up to `limit` bytes (fewer if the body ends first), or None past the deadline."""
        import gevent  # only ever runs in a gevent worker

        body = bytearray()
        with gevent.Timeout(self.read_timeout, False):  # False: leave the block silently
            while len(body) < limit:
                chunk = stream.read(min(READ_CHUNK_BYTES, limit - len(body)))
                if not chunk:
                    break
                body += chunk
            return bytes(body)
        return None


def serve(options: ServeOptions) -> None:
    # prometheus_client picks its multi-process storage when it is first imported, so the
    # directory must exist before the app (and its metrics) is imported.
    metrics_directory = metrics_dir.create()
    master = os.getpid()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_directory
    from gunicorn.app.base import BaseApplication

    from hooks.app import create_app
    from hooks.observability import LOGGING

    # Workers inherit the compiled schema validators instead of each compiling them on a call.
    kubernetes_schema.warm_up()

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", [options.bind])
            self.cfg.set("workers", options.workers)
            self.cfg.set("worker_class", "gevent")
            self.cfg.set("timeout", options.timeout)
            # Also the deadline for a request's line and headers: a client that has not sent
            # them within 5 s is disconnected. Longer than Go's idle-connection reuse needs.
            self.cfg.set("keepalive", 5)
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_SECONDS)
            self.cfg.set("logconfig_dict", LOGGING)
            # /tmp may be the only writable place with a read-only root filesystem.
            self.cfg.set("worker_tmp_dir", "/tmp")
            self.cfg.set("child_exit", lambda _server, worker: metrics_dir.fold_dead_worker(metrics_directory, worker.pid))
            if "control_socket_disable" in self.cfg.settings:
                # Unused, and it would need a writable home directory.
                self.cfg.set("control_socket_disable", True)
            if options.certfile:
                self.cfg.set("certfile", options.certfile)
                self.cfg.set("keyfile", options.keyfile)

        def load(self) -> Any:
            app = create_app(options.max_request_bytes, options.auth)
            return BufferedBody(app.wsgi_app, options.max_request_bytes, options.read_timeout)

    try:
        HookServer().run()
    finally:
        # A gunicorn worker is a fork that leaves through this same frame when it exits: only
        # the master owns the directory, which its replacement workers still write to.
        if os.getpid() == master:
            shutil.rmtree(metrics_directory, ignore_errors=True)

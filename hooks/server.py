"""`infera-hooks serve`: the hook app under gunicorn, with gevent workers.

A sync worker is held by one connection from its first byte to its last, so a few clients
sending slowly (or not at all) would leave nothing to answer Metacontroller or the kubelet's
probes. A gevent worker waits on sockets cooperatively: a slow connection costs a greenlet, and
deadlines bound how long it may take:

- request line and headers: gunicorn's keep-alive timeout (5 s; the connection is closed);
  sooner when the worker holds its most connections and this one has waited longest
  (`Connections`: idle clients never keep out a probe or a hook call);
- the body: `client_timeout` seconds once the app starts reading it (408);
- every send and receive on the socket: `client_timeout` (a client that stops reading its
  answer is disconnected instead of holding the greenlet, its body and the answer).

Reading a body whole before the app sees it bounds memory too: a worker buffers bodies up to
1 MiB within one budget (SMALL_BODIES_BYTES) and larger ones within another (one maximum-size
body), and turns away with 503 a body that does not fit. A body takes its budget as it
arrives, a chunk ahead, not as much as it declares: a client that sends slowly holds one chunk
of it, and a worker's connections all sending slowly cannot fill it. Unauthenticated bodies
are never buffered: the app refuses them (401) without reading them.
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
# Metacontroller's bodies are tens of kilobytes: bodies up to SMALL_BODY_BYTES share a budget
# of their own, so two huge uploads in progress never turn a normal hook call away.
SMALL_BODY_BYTES = 1024 * 1024
SMALL_BODIES_BYTES = 8 * 1024 * 1024
# What a body reads at once, and so holds of its budget beyond what has arrived.
READ_CHUNK_BYTES = 64 * 1024
# On SIGTERM, hook calls in flight get this long to finish before the workers exit.
GRACEFUL_TIMEOUT_SECONDS = 20
# Connections a worker holds at once; far above Metacontroller's concurrency, and a bound on
# what misbehaving clients can hold: all of them waiting on a chunk of their bodies still
# leave room for a body of SMALL_BODY_BYTES.
WORKER_CONNECTIONS = 100

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict, StartResponse], Iterable[bytes]]
Refused = Callable[[str, str], None]  # (request path, outcome): counted in the hook metrics


@dataclass(frozen=True)
class ServeOptions:
    bind: str
    workers: int
    timeout: int
    client_timeout: float
    max_request_bytes: int
    auth: TokenFile | None
    certfile: str | None
    keyfile: str | None


def _plain_error(start_response: StartResponse, status: str, message: str) -> list[bytes]:
    # No Connection: close (gunicorn drops hop-by-hop headers): an unread rest of the body is
    # discarded under the keep-alive timeout before the connection takes another request.
    body = json.dumps({"error": message}).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]


# The WSGI environ key under which BufferedBody hands the app a body it has read whole, within
# the size limit.
BUFFERED_BODY = "infera.buffered_body"


class BufferedBody:
    """WSGI middleware: read the request body whole, within a deadline and a byte budget,
    before the app runs (the app then never waits on a client)."""

    def __init__(
        self, app: WsgiApp, max_request_bytes: int, client_timeout: float, auth: TokenFile | None, refused: Refused
    ) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.client_timeout = client_timeout
        self.auth = auth
        self.refused = refused
        self.room = {"small": SMALL_BODIES_BYTES, "large": max_request_bytes + 1}

    def __call__(self, environ: dict, start_response: StartResponse) -> Iterable[bytes]:
        declared = environ.get("CONTENT_LENGTH") or ""
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if not chunked and (not declared.isdigit() or not 0 < int(declared) <= self.max_request_bytes):
            # No body, or one too large: the app answers (413) without reading it.
            return self.app(environ, start_response)
        if self.auth is not None and not self.auth.admits(environ.get("HTTP_AUTHORIZATION")):
            return self.app(environ, start_response)  # 401, the body unread
        # A chunked body's size is known only once read: read the most the app accepts, and one
        # byte more to show that a body is larger (the app then answers 413).
        limit = self.max_request_bytes + 1 if chunked else int(declared)
        pool = "small" if limit <= SMALL_BODY_BYTES else "large"
        path = environ.get("PATH_INFO", "")
        # A declared size that does not fit in what is free now is refused before it is read.
        body = "busy" if not chunked and limit > self.room[pool] else self._read(environ["wsgi.input"], limit, pool)
        if isinstance(body, str):
            return self._refuse(body, path, start_response)
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        environ.pop("HTTP_TRANSFER_ENCODING", None)
        if len(body) <= self.max_request_bytes:
            # The app takes the body from here rather than reading the stream again through
            # werkzeug's size-limited reader (a tenth of a cached answer's cost).
            environ[BUFFERED_BODY] = body
        return self.app(environ, start_response)

    def _refuse(self, outcome: str, path: str, start_response: StartResponse) -> list[bytes]:
        self.refused(path, outcome)
        if outcome == "busy":
            return _plain_error(start_response, "503 Service Unavailable", "too many request bodies at once: retry")
        log.warning("no complete request body on %s within %g s", path, self.client_timeout)
        message = f"the request body did not arrive within {self.client_timeout:g} s"
        return _plain_error(start_response, "408 Request Timeout", message)

    def _read(self, stream: Any, limit: int, pool: str) -> bytes | str:
        """Up to `limit` bytes (fewer if the body ends first), taking room from `pool` as they
        arrive; or why not: "timeout" past the deadline, "busy" when the next chunk does not fit."""
        import gevent  # only ever runs in a gevent worker

        chunks, held = [], 0  # held: the room taken, what arrived and then the chunk awaited
        try:
            with gevent.Timeout(self.client_timeout, False):  # False: leave the block silently
                try:
                    while held < limit:
                        wanted = min(READ_CHUNK_BYTES, limit - held)
                        if wanted > self.room[pool]:
                            return "busy"
                        self.room[pool] -= wanted
                        held += wanted
                        chunk = stream.read(wanted)
                        self.room[pool] += wanted - len(chunk)
                        held -= wanted - len(chunk)
                        if not chunk:
                            break
                        chunks.append(chunk)
                except TimeoutError:  # the socket's own deadline, as long as this one
                    return "timeout"
                # Most bodies arrive as one chunk: kept as it is, not copied.
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            return "timeout"
        finally:
            self.room[pool] += held


class Connections:
    """The client connections of one gevent worker. gevent's pool holds at most `limit` (then
    the worker accepts no more): once this many are open, the one that has waited longest for
    a request (idle between keep-alive requests, or not sending its line and headers) is closed,
    as its keep-alive timeout would, for each connection that opens or goes idle. So a new
    connection waits only while `limit` connections are each in a request, its body arriving
    or its answer leaving, both within the client timeout."""

    def __init__(self, limit: int, keepalive: float) -> None:
        self.limit = limit
        self.keepalive = keepalive
        self.open = 0
        # The greenlets waiting for a request, each with the timeout that ends its wait, in the
        # order they began to wait.
        self._waiting: dict[Any, Any] = {}

    def opened(self) -> None:
        self.open += 1
        self._make_room()

    def closed(self) -> None:
        self.open -= 1

    def request_wait(self) -> "RequestWait":
        """What gunicorn waits for a request under (its worker's timeout_ctx)."""
        import gevent

        return RequestWait(self, gevent.getcurrent(), gevent.Timeout(self.keepalive, False))

    def waiting(self, greenlet: Any, timeout: Any) -> None:
        self._waiting[greenlet] = timeout
        self._make_room()

    def done_waiting(self, greenlet: Any) -> None:
        self._waiting.pop(greenlet, None)

    def _make_room(self) -> None:
        if self.open >= self.limit and self._waiting:
            import gevent

            gevent.get_hub().loop.run_callback(self._close_longest_waiting)

    def _close_longest_waiting(self) -> None:
        # Runs in the hub, where a timeout expires too: a greenlet still in _waiting is
        # suspended in its wait, so its own timeout ends the wait, which closes the connection.
        if self.open >= self.limit and self._waiting:
            greenlet, timeout = next(iter(self._waiting.items()))
            del self._waiting[greenlet]
            greenlet.throw(timeout)


@dataclass(slots=True)
class RequestWait:
    """gunicorn's keep-alive timeout around one wait for a request, which Connections may end
    early."""

    connections: Connections
    greenlet: Any
    timeout: Any  # a silent gevent.Timeout: gunicorn reads no request and closes the connection

    def __enter__(self) -> None:
        self.timeout.start()
        self.connections.waiting(self.greenlet, self.timeout)

    def __exit__(self, *exception: Any) -> bool:
        self.connections.done_waiting(self.greenlet)
        return bool(self.timeout.__exit__(*exception))  # True: the timeout ended the wait


def serve(options: ServeOptions) -> None:
    # prometheus_client picks its multi-process storage when it is first imported, so the
    # directory must exist before the app (and its metrics) is imported.
    metrics_directory = metrics_dir.create()
    master = os.getpid()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_directory
    from gunicorn import glogging
    from gunicorn.app.base import BaseApplication
    from gunicorn.workers.ggevent import GeventWorker

    from hooks.app import HOOKS, create_app
    from hooks.observability import CALL_LINES, LOGGING, STATE_TABLE, record

    def refused(path: str, outcome: str) -> None:
        hook = path.strip("/")
        record(hook if hook in HOOKS else "other", outcome, 0.0, None, None)

    class HookWorker(GeventWorker):
        """gevent's worker, but a client socket gives up after client_timeout (gunicorn's
        makes it blocking for good, so a client that stopped reading held its connection), and
        idle connections make room for new ones (Connections)."""

        def init_process(self) -> None:
            self.connections = Connections(self.worker_connections, self.cfg.keepalive)
            super().init_process()

        def timeout_ctx(self) -> RequestWait:
            return self.connections.request_wait()

        def handle(self, listener: Any, client: Any, addr: Any) -> None:
            client.settimeout(options.client_timeout)
            self.connections.opened()
            try:
                super(GeventWorker, self).handle(listener, client, addr)  # not GeventWorker's: it undoes this
            finally:
                self.connections.closed()

    # Workers inherit the compiled schema validators instead of each compiling them on a call.
    kubernetes_schema.warm_up()

    def fold(pid: int) -> None:
        # Runs in gunicorn's arbiter loop, where an exception would stop the master.
        try:
            metrics_dir.fold_dead_worker(metrics_directory, pid)
        except Exception:
            log.exception("could not fold the metrics of dead worker %s", pid)

    def write_pending() -> None:
        # A worker leaving writes the states it noted last (a killed one loses at most
        # FLUSH_SECONDS of them, noted again on each one's next sync) and its last call lines.
        # gunicorn also calls this in the master, for a worker already gone: the master notes
        # nothing.
        if os.getpid() != master:
            STATE_TABLE.flush()
            CALL_LINES.flush()

    class HookLogger(glogging.Logger):
        """gunicorn's logger without its access log: every hook call logs one line already,
        and probes every few seconds would drown them. (Configured logging turns gunicorn's
        access log on, and it formats each request's line before the level drops it.)"""

        def access(self, *args: Any) -> None:
            pass

    class HookServer(BaseApplication):
        def load_config(self) -> None:
            self.cfg.set("bind", [options.bind])
            self.cfg.set("workers", options.workers)
            self.cfg.set("worker_class", HookWorker)
            self.cfg.set("worker_connections", WORKER_CONNECTIONS)
            self.cfg.set("timeout", options.timeout)
            # How long an idle connection stays open, and also the deadline for a request's
            # line and headers: a client that has not sent them within 5 s is disconnected.
            self.cfg.set("keepalive", 5)
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_SECONDS)
            self.cfg.set("logconfig_dict", LOGGING)
            self.cfg.set("logger_class", HookLogger)
            # /tmp may be the only writable place with a read-only root filesystem.
            self.cfg.set("worker_tmp_dir", "/tmp")
            self.cfg.set("child_exit", lambda _server, worker: fold(worker.pid))
            self.cfg.set("worker_exit", lambda _server, _worker: write_pending())
            if "control_socket_disable" in self.cfg.settings:
                # Unused, and it would need a writable home directory.
                self.cfg.set("control_socket_disable", True)
            if options.certfile:
                self.cfg.set("certfile", options.certfile)
                self.cfg.set("keyfile", options.keyfile)

        def load(self) -> Any:
            app = create_app(options.max_request_bytes, options.auth)
            return BufferedBody(app.wsgi_app, options.max_request_bytes, options.client_timeout, options.auth, refused)

    try:
        HookServer().run()
    finally:
        # A gunicorn worker is a fork that leaves through this same frame when it exits: only
        # the master owns the directory, which its replacement workers still write to.
        if os.getpid() == master:
            shutil.rmtree(metrics_directory, ignore_errors=True)

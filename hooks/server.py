"""`infera-hooks serve`: the hook app under gunicorn, with gevent workers.

A sync worker is held by one connection from its first byte to its last, so a few clients
sending slowly (or not at all) would leave nothing to answer Metacontroller or the kubelet's
probes. A gevent worker waits on sockets cooperatively: a slow connection costs a greenlet, and
deadlines bound how long it may take:

- request line and headers: gunicorn's keep-alive timeout (5 s; the connection is closed);
  sooner when the worker holds its most connections and this one has waited longest
  (`Connections`: clients that send nothing never keep out a probe or a hook call);
- the body: `client_timeout` seconds once the app starts reading it (408);
- every send and receive on the socket: `client_timeout` (a client that stops reading its
  answer is disconnected instead of holding the greenlet, its body and the answer).

The body is read whole, within its own budget of bytes, before the app sees it (hooks.body).
Each connection carries one request (`Connection: close`): none is left idle for a client to
reuse just as the server closes it.
"""

import logging
import os
import shutil
import signal
from dataclasses import dataclass
from typing import Any

from hooks import kubernetes_schema, metrics_dir
from hooks.auth import TokenFile
from hooks.body import BufferedBody

log = logging.getLogger("hooks")
# On SIGTERM, hook calls in flight get this long to finish before the workers exit.
GRACEFUL_TIMEOUT_SECONDS = 20
# Connections a worker holds at once; far above Metacontroller's concurrency, and a bound on
# what misbehaving clients can hold: all of them waiting on a chunk of their bodies still
# leave room for a body of SMALL_BODY_BYTES.
WORKER_CONNECTIONS = 100
# What a connection's unread body is read in, to be dropped before the connection closes.
DRAIN_CHUNK_BYTES = 64 * 1024
# The signals a gunicorn worker exits on. From its fork until it has installed its own handlers,
# a worker runs the master's, which only queue a signal for the master's loop (a loop the worker
# never runs): a SIGTERM then would be lost, and the worker would serve on, to be killed only
# when the master gives up on it after the graceful timeout. So they are held blocked across
# the fork and delivered once the worker's own handlers are in place.
WORKER_EXIT_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGABRT})


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


class Connections:
    """The client connections of one gevent worker. gevent's pool holds at most `limit` (then
    the worker accepts no more): once this many are open, the one that has waited longest for
    its request (not sending its line and headers) is closed, as its keep-alive timeout would,
    for each connection that opens or begins to wait. So a new
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

    from hooks import observability
    from hooks.app import HOOKS, create_app
    from hooks.observability import LOGGING, record

    observability.configure(metrics_directory)
    # The JSON lines name no thread or process: log records skip looking them up (under gevent,
    # the thread would be a dummy made for each connection's greenlet).
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False

    def refused(path: str, outcome: str) -> None:
        hook = path.strip("/")
        record(hook if hook in HOOKS else "other", outcome, 0.0, None, None)

    class HookWorker(GeventWorker):
        """gevent's worker, but a client socket gives up after client_timeout (gunicorn's
        makes it blocking for good, so a client that stopped reading held its connection),
        connections waiting for a request make room for new ones (Connections), and each
        connection carries one request."""

        def init_process(self) -> None:
            self.connections = Connections(self.worker_connections, self.cfg.keepalive)
            super().init_process()

        def init_signals(self) -> None:
            super().init_signals()
            # Blocked since before the fork (hold_exit_signals): one that arrived while this worker
            # booted is delivered now, to its own handler.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_EXIT_SIGNALS)

        def timeout_ctx(self) -> RequestWait:
            return self.connections.request_wait()

        def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> None:
            # One request per connection. A connection left idle would be closed at the keep-alive
            # timeout, and a client's next request could meet that close on the way: Go's client
            # (Metacontroller's) keeps idle connections for 90 s, and its partly written POST fails
            # with a broken pipe and is not retried. Closed after each answer, none is left idle.
            req.must_close = True
            try:
                super().handle_request(listener_name, req, sock, addr)
            finally:
                self.drain(req)

        def drain(self, req: Any) -> None:
            # What the answer left unread of the body (a 413 answers before it arrives) is read
            # and dropped, within the keep-alive timeout: a socket closed on unread data resets
            # the connection, and the client may lose the answer.
            import gevent
            from gunicorn.http.errors import ParseException

            with gevent.Timeout(self.cfg.keepalive, False):
                try:
                    while req.body.read(DRAIN_CHUNK_BYTES):
                        pass
                except (OSError, ParseException):
                    pass  # the client is gone or its body is malformed: nothing to save

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

    def hold_exit_signals(_server: Any, _worker: Any) -> None:
        # gunicorn's pre_fork, in the master just before it forks a worker: the worker starts with
        # them blocked (HookWorker.init_signals unblocks them); the master unblocks them as soon as
        # the fork returns, so a signal meant for it waits no longer than the fork.
        signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_EXIT_SIGNALS)

    os.register_at_fork(after_in_parent=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_EXIT_SIGNALS))

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
            # The deadline for a request's line and headers: a client that has not sent them
            # within 5 s is disconnected. (No connection is kept idle: HookWorker.handle_request.)
            self.cfg.set("keepalive", 5)
            self.cfg.set("graceful_timeout", GRACEFUL_TIMEOUT_SECONDS)
            self.cfg.set("logconfig_dict", LOGGING)
            self.cfg.set("logger_class", HookLogger)
            # /tmp may be the only writable place with a read-only root filesystem.
            self.cfg.set("worker_tmp_dir", "/tmp")
            self.cfg.set("child_exit", lambda _server, worker: fold(worker.pid))
            self.cfg.set("pre_fork", hold_exit_signals)
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

"""The request body, read whole before the app runs (the app then never waits on a client),
within the client timeout (408). Reading it whole bounds memory too: a worker buffers bodies up to
1 MiB within one budget (SMALL_BODIES_BYTES) and larger ones within another (one maximum-size
body), and turns away with 503 a body that does not fit. A body takes its budget as it
arrives, a chunk ahead, not as much as it declares: a client that sends slowly holds one chunk
of it, and a worker's connections all sending slowly cannot fill it. Unauthenticated bodies
are never buffered: the app refuses them (401) without reading them.
"""

import io
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from hooks.auth import TokenFile

log = logging.getLogger("hooks")
# Metacontroller's bodies are tens of kilobytes: bodies up to SMALL_BODY_BYTES share a budget
# of their own, so two huge uploads in progress never turn a normal hook call away.
SMALL_BODY_BYTES = 1024 * 1024
SMALL_BODIES_BYTES = 8 * 1024 * 1024
# What a body reads at once, and so holds of its budget beyond what has arrived.
READ_CHUNK_BYTES = 64 * 1024

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict, StartResponse], Iterable[bytes]]
Refused = Callable[[str, str], None]  # (request path, outcome): counted in the hook metrics


def _plain_error(start_response: StartResponse, status: str, message: str) -> list[bytes]:
    # The connection closes after this answer (hooks.server): an unread rest of the body is
    # never taken for another request.
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
            # werkzeug's size-limited reader, which copies it in chunks.
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

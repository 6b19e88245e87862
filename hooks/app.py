"""The HTTP adapter: the only module that knows about Flask.

Every answer is JSON. Malformed requests get a 4xx with `{"error": ...}`; a request that parses
always gets a complete 200 answer (a bad spec is reported in status, not as an HTTP error).
Hook endpoints may require a bearer token; health and metrics stay open.
"""

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from hooks import observability, reconcile, teardown
from hooks.auth import TokenFile
from hooks.body import BUFFERED_BODY
from hooks.contract import DEFAULT_MAX_REQUEST_BYTES, BadRequest, HookRequest, decode, parse_request
from hooks.encoding import canonical_json
from hooks.memo import BUILD_DIGEST, RenderMemo

OPEN_PATHS = ("/healthz", "/readyz", "/metrics")
log = logging.getLogger("hooks")


# A hook's reply: the answer as canonical JSON, and what the log line and metrics say of it.
Reply = tuple[bytes, observability.Summary]


def _reply(answer: dict[str, Any]) -> Reply:
    return canonical_json(answer), observability.Summary.of(answer)


def _sync(request: HookRequest, memo: RenderMemo) -> Reply:
    answer = reconcile.sync_answer(request, memo=memo)
    # Only a failed answer's message is read back: the log line gives it as the reason.
    reason = orjson.loads(answer.status_json).get("message") if answer.state == "failed" else None
    return answer.json(), observability.Summary(answer.state, len(answer.children), reason=reason)


# Every hook is a pure function of the request (sync memoises its renders in the worker's memo),
# and whether its answers may be cached. Teardown answers depend on the clock (a pod past its
# deletion deadline, the blind drain window): the same request must get a new answer once time
# has moved.
HOOK_TABLE: dict[str, tuple[Callable[[HookRequest, RenderMemo], Reply], bool]] = {
    "sync": (_sync, True),
    "finalize": (lambda request, memo: _reply(teardown.finalize(request)), False),
    "customize": (lambda request, memo: _reply(teardown.customize(request)), True),
}
HOOKS = tuple(HOOK_TABLE)


def json_response(body: Any, status: int = 200) -> Response:
    return Response(canonical_json(body), status=status, mimetype="application/json")


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


@dataclass(frozen=True)
class Answer:
    body: bytes
    outcome: str
    parent: dict  # only its identity, for the log line and metrics
    summary: observability.Summary


class AnswerCache:
    """Answers by ETag, least recently used first out, bounded in bytes.

    An answer is a function of its request, and Metacontroller resends unchanged requests on
    every resync and child event, so most calls are repeats: serving them from here skips
    validation, rendering and serialisation. An answer is kept only when its request comes a
    second time: most requests that differ at all (a resourceVersion moved) never come again,
    and keeping each would push out the answers that do repeat, and cost a write to cold
    memory every call (a tenth of a distinct sync's cost).
    """

    def __init__(self, max_bytes: int, max_sightings: int) -> None:
        self.max_bytes = max_bytes
        self.max_sightings = max_sightings
        self._answers: OrderedDict[str, Answer] = OrderedDict()
        self._bytes = 0
        # ETags answered once and not kept, oldest first out.
        self._sightings: dict[str, None] = {}
        self._lock = threading.Lock()

    def get(self, etag: str) -> Answer | None:
        with self._lock:
            answer = self._answers.get(etag)
            if answer is not None:
                self._answers.move_to_end(etag)
            return answer

    def put(self, etag: str, answer: Answer) -> None:
        """Keep an answer if its request was answered before (and it fits)."""
        if len(answer.body) > self.max_bytes:
            return
        with self._lock:
            if etag in self._answers:
                return
            if self._sightings.pop(etag, self) is self:  # a first sighting
                self._sightings[etag] = None
                if len(self._sightings) > self.max_sightings:
                    del self._sightings[next(iter(self._sightings))]
                return
            self._answers[etag] = answer
            self._bytes += len(answer.body)
            while self._bytes > self.max_bytes:
                _, evicted = self._answers.popitem(last=False)
                self._bytes -= len(evicted.body)


# Per gunicorn worker: about 350 PD graphs' answers, the last ones resent. A miss costs little
# more than decoding the request: the render memo holds the children and the status, and holds
# a fleet's (docs/performance.md).
ANSWER_CACHE_BYTES = 4 * 1024 * 1024
# ETags of requests answered once, to recognise a second sighting: a fleet's worth of parents
# between two resyncs of one, in about 0.5 MiB.
ANSWER_CACHE_SIGHTINGS = 4096


@functools.cache
def _etag_prefix(hook: str) -> "hashlib._Hash":
    return hashlib.sha256(BUILD_DIGEST + b"\0" + hook.encode() + b"\0")


def _etag(hook: str, body: bytes) -> str:
    # An ETag names the answer to one request body for one hook, by this build of the code.
    # (The prefix's state is copied, not the body: that copy was a tenth of the ETag's cost.)
    digest = _etag_prefix(hook).copy()
    digest.update(body)
    return f'"{digest.hexdigest()[:40]}"'


def _not_modified(etag: str, wanted: str) -> bool:
    # Only an exact match: `*` would answer 304 to a request whose answer was never sent.
    return etag in (tag.strip() for tag in wanted.split(","))


def _hook(
    name: str, handler: Callable[[HookRequest, RenderMemo], Reply], memo: RenderMemo, cache: AnswerCache | None
) -> Response:
    """Answer one hook call. With a cache, a repeated request is answered from it (or 304 by
    ETag); without one, every call is computed afresh."""
    started = time.perf_counter()
    parent: dict | None = None
    summary: observability.Summary | None = None
    outcome = "bad_request"  # until the request has parsed

    def refuse(status: int, message: str) -> Response:
        """A request that is no hook request: answered with its reason, which its log line says."""
        nonlocal outcome, summary
        outcome, summary = "bad_request", observability.Summary(None, None, reason=message)
        return error_response(status, message)

    try:
        if not request.is_json:
            return refuse(415, "Content-Type must be application/json")
        environ = request.environ
        raw = environ.get(BUFFERED_BODY)
        if raw is None:  # not served through BufferedBody (the Flask test client)
            raw = request.get_data()
        etag = None
        if cache is not None:
            etag = _etag(name, raw)
            if _not_modified(etag, environ.get("HTTP_IF_NONE_MATCH", "")):
                outcome = "not_modified"
                return Response(status=304, headers={"ETag": etag})
            cached = cache.get(etag)
            if cached is not None:
                outcome, parent, summary = cached.outcome, cached.parent, cached.summary
                return Response(cached.body, mimetype="application/json", headers={"ETag": etag})
        try:
            hook_request = parse_request(decode(raw))
        except ValueError as error:  # JSONDecodeError and BadRequest
            prefix = "" if isinstance(error, BadRequest) else "request body is not valid JSON: "
            return refuse(400, f"{prefix}{error}")
        except RecursionError:
            return refuse(400, "request body is nested too deeply")
        parent = hook_request.parent
        outcome = "error"  # unless the handler answers
        try:
            body, summary = handler(hook_request, memo)
        except RecursionError:  # deeper than decoding allowed, as deep as encoding cannot go
            return refuse(400, "request body is nested too deeply")
        outcome = "failed" if summary.state == "failed" else "ok"
        response = Response(body, mimetype="application/json")
        if cache is not None and etag is not None:
            response.headers["ETag"] = etag
            identity = {
                k: v for k, v in (parent.get("metadata") or {}).items() if k in ("namespace", "name", "generation")
            }
            cache.put(etag, Answer(body, outcome, {"metadata": identity}, summary))
        return response
    finally:
        observability.record(name, outcome, time.perf_counter() - started, parent, summary)


# A small valid graph /readyz renders through the same code as /sync, extraPodSpec and patches
# included (so the schema validators and admission checks run too).
READINESS_PROBE_REQUEST = {
    "parent": {
        "apiVersion": "infera.amd.com/v1alpha1",
        "kind": "InferaDeployment",
        "metadata": {"name": "readyz", "namespace": "readyz", "generation": 1},
        "spec": {
            "image": "rocm/infera:sglang-v0.1.1",
            "services": {
                "server": {"componentType": "server", "args": ["--router-tokenizer-path", "Qwen/Qwen3-0.6B"]},
                "worker": {
                    "componentType": "worker",
                    "role": "mixed",
                    "args": ["--model-path", "Qwen/Qwen3-0.6B"],
                    "extraPodSpec": {"containers": [{"name": "main", "env": [{"name": "READYZ", "value": "1"}]}]},
                },
            },
            "patches": [
                {
                    "target": {"kind": "Deployment", "name": "readyz-worker"},
                    "patch": [{"op": "add", "path": "/metadata/annotations", "value": {"example.com/readyz": "1"}}],
                }
            ],
        },
    },
    "children": {},
}


def _render_problem() -> str | None:
    """Why this worker cannot answer /sync, or None."""
    try:
        answer = reconcile.sync(parse_request(READINESS_PROBE_REQUEST))
    except Exception as error:  # the probe reports it; the hook path logs its own
        return f"rendering a known-good graph raised {type(error).__name__}"
    if answer["status"]["state"] == "failed" or not answer["children"]:
        return f"a known-good graph renders as failed: {answer['status'].get('message')}"
    return None


def create_app(max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, auth: TokenFile | None = None) -> Flask:
    app = Flask(__name__)
    cache = AnswerCache(ANSWER_CACHE_BYTES, ANSWER_CACHE_SIGHTINGS)
    memo = RenderMemo()
    # Larger bodies get 413 before they are read.
    app.config["MAX_CONTENT_LENGTH"] = max_request_bytes

    @app.before_request
    def authenticate() -> Response | None:
        if auth is None or request.path in OPEN_PATHS or auth.admits(request.headers.get("Authorization")):
            return None
        hook = request.path.strip("/")
        # Only known names become metric labels: any path would otherwise make a new series.
        observability.record(hook if hook in HOOKS else "other", "unauthorized", 0.0, None, None)
        response = error_response(401, "a valid bearer token is required (Authorization: Bearer <token>)")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    for name, (handler, cached) in HOOK_TABLE.items():
        app.add_url_rule(
            f"/{name}", name, functools.partial(_hook, name, handler, memo, cache if cached else None), methods=["POST"]
        )

    @app.get("/healthz")
    def healthz() -> Response:
        problem = observability.storage_problem()
        return (
            json_response({"status": "unhealthy", "reason": problem}, 503)
            if problem
            else json_response({"status": "ok"})
        )

    @app.get("/readyz")
    def readyz() -> Response:
        problem = observability.storage_problem() or _render_problem()
        return (
            json_response({"status": "not ready", "reason": problem}, 503)
            if problem
            else json_response({"status": "ready"})
        )

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(observability.metrics(), mimetype=None, content_type=observability.CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        response = error_response(error.code or 500, error.description or error.name)
        if error.code == 405:
            response.headers["Allow"] = ", ".join(sorted(getattr(error, "valid_methods", None) or []))
        return response

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        log.exception("unhandled error on %s", request.path)
        # Say what failed, not where: an exception's text can hold file paths and internals.
        return error_response(
            500,
            f"internal error while answering {request.path} ({type(error).__name__}); the hook's log has the details",
        )

    return app

"""The HTTP adapter: the only module that knows about Flask.

Every answer is JSON. Malformed requests get a 4xx with `{"error": ...}`; a request that parses
always gets a complete 200 answer (a bad spec is reported in status, not as an HTTP error).
Hook endpoints may require a bearer token; health and metrics stay open.
"""

import functools
import hashlib
import logging
import time
from collections.abc import Callable
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
# and whether its answers carry an ETag, which lets Metacontroller reuse one for an unchanged
# request (a bodiless 304). Finalize answers depend on the clock (a pod past its deletion
# deadline, the blind drain window): the same request must get a new answer once time has moved.
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


@functools.cache
def _etag_prefix(hook: str) -> "hashlib._Hash":
    return hashlib.sha256(BUILD_DIGEST + b"\0" + hook.encode() + b"\0")


def _etag(hook: str, body: bytes) -> str:
    # An ETag names the answer to one request body for one hook, by this build of the code.
    # (The prefix's state is copied, not the body.)
    digest = _etag_prefix(hook).copy()
    digest.update(body)
    return f'"{digest.hexdigest()[:40]}"'


def _not_modified(etag: str, wanted: str) -> bool:
    # Only an exact match: `*` would answer 304 to a request whose answer was never sent.
    return etag in (tag.strip() for tag in wanted.split(","))


def _hook(name: str, handler: Callable[[HookRequest, RenderMemo], Reply], memo: RenderMemo, tagged: bool) -> Response:
    """Answer one hook call; if `tagged`, with its ETag, and 304 to a request that names it."""
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
        etag = _etag(name, raw) if tagged else None
        if etag is not None and _not_modified(etag, environ.get("HTTP_IF_NONE_MATCH", "")):
            outcome = "not_modified"
            return Response(status=304, headers={"ETag": etag})
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
        return Response(body, mimetype="application/json", headers={"ETag": etag} if etag else None)
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

    for name, (handler, tagged) in HOOK_TABLE.items():
        app.add_url_rule(f"/{name}", name, functools.partial(_hook, name, handler, memo, tagged), methods=["POST"])

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

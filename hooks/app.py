"""The HTTP adapter: the only module that knows about Flask.

Every answer is JSON. Malformed requests get a 4xx with `{"error": ...}`; a request that parses
always gets a complete 200 answer (a bad spec is reported in status, not as an HTTP error).
"""

import json
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from hooks import reconcile, teardown
from hooks.contract import BadRequest, HookRequest, parse_request

# Metacontroller sends the parent plus every child; 16 MiB is far above any real graph.
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


def json_response(body: Any, status: int = 200) -> Response:
    # Sorted keys and no spaces: the same request always yields byte-identical answers.
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return Response(text, status=status, mimetype="application/json")


def error_response(status: int, message: str) -> Response:
    return json_response({"error": message}, status)


def _hook(handler: Callable[[HookRequest], dict]) -> Response:
    if not request.is_json:
        return error_response(415, "Content-Type must be application/json")
    try:
        body = json.loads(request.get_data())
    except ValueError as error:
        return error_response(400, f"request body is not valid JSON: {error}")
    except RecursionError:
        return error_response(400, "request body is nested too deeply")
    try:
        hook_request = parse_request(body)
    except BadRequest as error:
        return error_response(400, str(error))
    return json_response(handler(hook_request))


def create_app(max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> Flask:
    app = Flask(__name__)
    # Larger bodies get 413 before they are read.
    app.config["MAX_CONTENT_LENGTH"] = max_request_bytes

    @app.post("/sync")
    def sync() -> Response:
        return _hook(reconcile.sync)

    @app.post("/finalize")
    def finalize() -> Response:
        return _hook(teardown.finalize)

    @app.post("/customize")
    def customize() -> Response:
        return _hook(lambda hook_request: teardown.customize(hook_request.parent))

    @app.get("/healthz")
    def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        return json_response({"status": "ready"})

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        response = error_response(error.code or 500, error.description or error.name)
        if error.code == 405:
            response.headers["Allow"] = ", ".join(sorted(error.valid_methods or []))
        return response

    return app

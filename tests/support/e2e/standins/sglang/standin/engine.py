"""What one request goes through, by the engine's role (--disaggregation-mode).

- mixed (`null`): wait for a running slot, prefill (the prompt's pages enter the cache and are
  published), decode token by token, then cache what was computed (prompt and reply but the
  last token, whose KV is never computed) as SGLang's cache_finished_req does.
- prefill: open the request's bootstrap room and wait for its decode engine to register, prefill
  (pages cached and published), hand the KV over, wait until the decode has taken it, then
  answer with the first token, as an SGLang prefill engine does.
- decode: register at the prefill's bootstrap server, wait for the KV (the prompt's ids, checked
  against its own), then decode; it caches and publishes only with
  --disaggregation-decode-enable-radix-cache, as SGLang's decode uses a chunk cache otherwise.

Each token takes STANDIN_TOKEN_DELAY seconds (default 0.01), and so does a prefill, so a test can
hold a request in flight. --disable-radix-cache turns caching (and KV events) off.
STANDIN_VERSION, when set, names the engine's build: every request's record carries it and
every reply's identity says it (`version=...`), so a test can tell two rollouts' engines apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sglang.srt.server_args import ServerArgs
from sglang.standin.bootstrap import PrefillRooms, kv_timeout, receive_kv, register_for_room, transfer_error
from sglang.standin.group import Group
from sglang.standin.model import Model
from sglang.standin.prefix_cache import PrefixCache
from sglang.standin.scheduler import EngineError, RequestRecord, Scheduler, State

DEFAULT_TOKEN_DELAY_S = 0.01
# The stand-in's pretend KV pool, in tokens, when --max-total-tokens does not size it.
DEFAULT_KV_POOL_TOKENS = 1 << 20
ROLES = {"null": "mixed", "prefill": "prefill", "decode": "decode"}


@dataclass
class Job:
    """A validated request: what to compute and for whom."""

    record: RequestRecord
    prompt_ids: list[int]
    max_new_tokens: int
    choices: int
    rank: int


@dataclass
class Step:
    """One generated token of one choice."""

    choice: int
    token_id: int
    text: str


class Engine:
    def __init__(self, server_args: ServerArgs, model: Model, caches: list[PrefixCache]) -> None:
        self.server_args = server_args
        self.model = model
        self.caches = caches
        self.role = ROLES[server_args.disaggregation_mode]
        self.pod = os.environ.get("POD_NAME") or socket.gethostname()
        self.scheduler = Scheduler(server_args.max_running_requests, server_args.max_queued_requests)
        self.group: Group | None = None  # set once a multi-node group formed
        self.rooms = PrefillRooms()
        self.token_delay = float(os.environ.get("STANDIN_TOKEN_DELAY", DEFAULT_TOKEN_DELAY_S))
        self.version = os.environ.get("STANDIN_VERSION") or None
        self.served_model_name = server_args.served_model_name or server_args.model_path
        self.kv_pool_tokens = int(server_args.max_total_tokens or DEFAULT_KV_POOL_TOKENS)
        self._round_robin = itertools.cycle(range(len(caches)))
        radix = not server_args.disable_radix_cache
        self._caches_prompts = radix and self.role in ("mixed", "prefill")
        decode_caches = self.role == "decode" and server_args.disaggregation_decode_enable_radix_cache
        self._caches_replies = radix and (self.role == "mixed" or decode_caches)

    def pick_rank(self, header: str | None, room: int | None) -> int:
        """The DP rank: the router's X-Data-Parallel-Rank, else the bootstrap room's residue (SGLang's
        follow_bootstrap_room), else round robin."""
        ranks = len(self.caches)
        if header is not None:
            if not header.isdigit() or int(header) >= ranks:
                raise EngineError(400, f"X-Data-Parallel-Rank {header!r} is not a rank of --dp-size {ranks}")
            return int(header)
        if room is not None:
            return room % ranks
        return next(self._round_robin)

    def identity(self, record: RequestRecord) -> str:
        """Who answered: role, pod, port, and the PD room. It ends every reply (with its last
        token), not heads it: a client that sends the reply back in its next turn then re-sends
        the generated tokens unchanged, so the prefix cache matches through them as a real
        model's would, and only this text, which is no token the model generated, differs."""
        room = f" room={record.bootstrap_room}" if record.bootstrap_room is not None else ""
        rank = f" dp={record.dp_rank}" if len(self.caches) > 1 else ""
        version = f" version={record.version}" if record.version is not None else ""
        return f"[{record.role} pod={self.pod} port={record.port}{room}{rank}{version}]"

    async def generate(self, job: Job) -> AsyncIterator[list[Step]]:
        """The request's tokens, one list (a token per choice) at a time. Opens the request's
        record when the work starts (a stream its client left before reading never does) and
        closes it whatever happens: ok, error (EngineError, re-raised) or aborted (the client
        went away); what the request held (a running slot, a PD room) is released at once."""
        record = job.record
        self.scheduler.open(record)
        try:
            async with contextlib.AsyncExitStack() as held:
                length = await self._ready_to_decode(job, held)
                identity = self.identity(record)
                replies = [self.model.reply(job.prompt_ids, length, choice) for choice in range(job.choices)]
                for position in range(length):
                    if position:
                        await asyncio.sleep(self.token_delay)
                    steps = []
                    for choice, reply in enumerate(replies):
                        text = self.model.text([reply[position]])
                        last = position == length - 1
                        steps.append(Step(choice, reply[position], f"{text} {identity}" if last else text))
                    record.completion_tokens += len(steps)
                    record.text += steps[0].text
                    yield steps
                if self._caches_replies:
                    for reply in replies:
                        self.caches[job.rank].insert(job.prompt_ids + reply[:-1])
            self.scheduler.close(record, "ok")
        except EngineError as error:
            self.scheduler.close(record, "error", error.message)
            raise
        finally:
            self.scheduler.close(record, "aborted")

    async def _ready_to_decode(self, job: Job, held: contextlib.AsyncExitStack) -> int:
        """Take the request through its role's phases up to its first token; returns how many
        tokens it generates (a prefill engine answers with one). What the request must hold
        while it generates is entered into `held`."""
        if self.role == "prefill":
            await self._prefill(job, held)
            return 1
        if self.role == "decode":
            await self._receive_kv(job)
        await held.enter_async_context(self.scheduler.running(job.record))
        if self.role == "mixed":
            await self._prefill_forward(job)
        elif self._caches_replies:
            job.record.cached_tokens = self.caches[job.rank].cached_prefix_length(job.prompt_ids)
        return job.max_new_tokens

    async def _prefill(self, job: Job, held: contextlib.AsyncExitStack) -> None:
        record = job.record
        room_id = record.bootstrap_room
        room = self.rooms.attach_prefill(room_id)
        held.callback(self.rooms.release, room_id)
        self.scheduler.move(record, State.PREFILL_BOOTSTRAP)
        try:
            await asyncio.wait_for(room.claimed.wait(), kv_timeout())
        except TimeoutError:
            why = "no decode engine registered for the room in time (was the decode sent this request?)"
            raise transfer_error(room_id, why) from None
        async with self.scheduler.running(record):
            await self._prefill_forward(job)
            room.prompt_ids = job.prompt_ids
            room.kv_ready.set()
        self.scheduler.move(record, State.PREFILL_INFLIGHT)
        try:
            await asyncio.wait_for(room.transferred.wait(), kv_timeout())
        except TimeoutError:
            raise transfer_error(room_id, "the decode engine never took the KV") from None

    async def _receive_kv(self, job: Job) -> None:
        record = job.record
        host, port, room_id = record.bootstrap_host, record.bootstrap_port, record.bootstrap_room
        deadline = time.monotonic() + kv_timeout()
        self.scheduler.move(record, State.DECODE_PREALLOC)
        await register_for_room(host, port, room_id, deadline)
        self.scheduler.move(record, State.DECODE_TRANSFER)
        transferred = await receive_kv(host, port, room_id, deadline)
        if transferred != job.prompt_ids:
            raise transfer_error(
                room_id,
                f"the prefill at {host}:{port} computed a different prompt ({len(transferred)} tokens) "
                f"than this request's ({len(job.prompt_ids)} tokens): the legs were sent different bodies",
            )

    async def _prefill_forward(self, job: Job) -> None:
        await asyncio.sleep(self.token_delay)
        if self._caches_prompts:
            cache = self.caches[job.rank]
            job.record.cached_tokens = cache.cached_prefix_length(job.prompt_ids)
            cache.insert(job.prompt_ids)

"""The PD handshake: a decode engine takes a prompt's KV from the prefill engine that computed it.

In SGLang the router sends one body, carrying `bootstrap_host`, `bootstrap_port` (the prefill
engine's bootstrap server) and `bootstrap_room` (a per-request id), to a prefill and a decode
engine at once. The decode engine reaches the prefill's bootstrap server and registers for the
room; the prefill engine, holding the request, waits for that, computes the prompt, and pushes
the KV; then both go on: the decode generates, the prefill answers. Either side gives up after a
timeout, and the request fails (KVTransferError).

The stand-in keeps that shape over HTTP on the bootstrap port, so every way a router can get PD
wrong fails as it does on SGLang: a prefill never told of the request leaves the decode waiting
for KV, a decode never told leaves the prefill waiting for it, a wrong bootstrap address cannot
be reached. What "KV" crosses is the prompt's token ids, which the decode engine checks against
its own: two legs given different bodies is an error here, not silently wrong output.

Timeouts are STANDIN_KV_TIMEOUT seconds (default 30; SGLang's are 300).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import httpx

from sglang.standin.scheduler import EngineError

DEFAULT_KV_TIMEOUT_S = 30.0
CLAIM_RETRY_INTERVAL_S = 0.05
ROOMS_PATH = "/standin/bootstrap/rooms"


def kv_timeout() -> float:
    return float(os.environ.get("STANDIN_KV_TIMEOUT", DEFAULT_KV_TIMEOUT_S))


def transfer_error(room: int, why: str) -> EngineError:
    return EngineError(500, f"KVTransferError(bootstrap_room={room}): {why}")


@dataclass
class Room:
    """One request's handoff, as the prefill engine sees it."""

    prefill_attached: bool = False
    prompt_ids: list[int] | None = None
    claimed: asyncio.Event = field(default_factory=asyncio.Event)
    kv_ready: asyncio.Event = field(default_factory=asyncio.Event)
    transferred: asyncio.Event = field(default_factory=asyncio.Event)


class PrefillRooms:
    """The prefill engine's side: rooms by id, whichever leg arrives first opens one."""

    def __init__(self) -> None:
        self._rooms: dict[int, Room] = {}

    def attach_prefill(self, room_id: int) -> Room:
        room = self._rooms.setdefault(room_id, Room())
        if room.prefill_attached:
            raise EngineError(400, f"bootstrap_room {room_id} is already in use on this prefill engine")
        room.prefill_attached = True
        return room

    def claim(self, room_id: int) -> None:
        """A decode engine registers for the room."""
        self._rooms.setdefault(room_id, Room()).claimed.set()

    async def take_kv(self, room_id: int, timeout: float) -> list[int] | None:
        """The prompt's KV once the prefill has computed it; None if it did not in time (the
        room is then dropped unless a prefill request holds it)."""
        room = self._rooms.setdefault(room_id, Room())
        try:
            await asyncio.wait_for(room.kv_ready.wait(), timeout)
        except TimeoutError:
            if not room.prefill_attached:
                self._rooms.pop(room_id, None)
            return None
        room.transferred.set()
        return room.prompt_ids

    def release(self, room_id: int) -> None:
        self._rooms.pop(room_id, None)


async def register_for_room(host: str, port: int, room_id: int, deadline: float) -> None:
    """The decode engine registers for the room at the prefill's bootstrap server, retrying
    while that cannot be reached, until `deadline` (time.monotonic())."""
    url = f"http://{host}:{port}{ROOMS_PATH}/{room_id}/claim"
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0)) as client:
        while True:
            try:
                reply = await client.post(url)
                break
            except httpx.TransportError as error:
                if time.monotonic() >= deadline:
                    raise transfer_error(room_id, f"bootstrap server {host}:{port} unreachable: {error!r}") from error
                await asyncio.sleep(CLAIM_RETRY_INTERVAL_S)
    if reply.status_code != 200:
        raise transfer_error(room_id, f"bootstrap server {host}:{port} answered {reply.status_code}")


async def receive_kv(host: str, port: int, room_id: int, deadline: float) -> list[int]:
    """The decode engine waits, until `deadline`, for the prefill to hand over the prompt's KV."""
    remaining = max(0.0, deadline - time.monotonic())
    url = f"http://{host}:{port}{ROOMS_PATH}/{room_id}/kv"
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(remaining + 5.0)) as client:
            reply = await client.get(url, params={"timeout": remaining})
    except httpx.HTTPError as error:
        raise transfer_error(room_id, f"KV transfer from {host}:{port} failed: {error!r}") from error
    if reply.status_code != 200:
        raise transfer_error(room_id, f"no KV from prefill {host}:{port} in time (was the prefill sent this request?)")
    return reply.json()["prompt_token_ids"]

"""Stand-in for `sglang.srt.disaggregation.kv_events`: KV cache events on SGLang 0.5.17's wire.

A subscriber (the Infera router's KvEventClient, the worker's NATS relay) decodes what this
publishes with its own schema of SGLang's format, so the bytes must be SGLang's:

- a ZMQ PUB socket, bound when the endpoint has a wildcard (`tcp://*:5557`) and connected
  otherwise, on `endpoint` + the DP rank's offset in the port;
- each message three frames: the configured topic, an 8-byte big-endian sequence number, and
  the msgspec msgpack encoding of a `KVEventBatch`;
- a batch is an array `[ts, events, attn_dp_rank]`, and every event a tagged array whose first
  element names its class: `["BlockStored", block_hashes, parent_block_hash, token_ids,
  block_size, lora_id, medium]`, `["AllBlocksCleared"]`.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from itertools import count
from typing import Any

import msgspec
import zmq

logger = logging.getLogger(__name__)

MEDIUM_GPU = "GPU"


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """An event is a msgpack array tagged with its class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | AllBlocksCleared]
    attn_dp_rank: int | None = None


@dataclass(frozen=True)
class KVEventsConfig:
    """`--kv-events-config`, a JSON object; keys SGLang does not know are ignored, as its
    pydantic model ignores them."""

    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    hwm: int = 100_000
    topic: str = ""

    @classmethod
    def from_cli(cls, text: str) -> KVEventsConfig:
        given: dict[str, Any] = json.loads(text)
        known = {name: given[name] for name in cls.__dataclass_fields__ if name in given}
        config = cls(**known)
        if config.publisher not in ("null", "zmq"):
            raise ValueError(f"Unknown event publisher '{config.publisher}'")
        return config


def offset_endpoint_port(endpoint: str, data_parallel_rank: int) -> str:
    """DP rank r publishes on the endpoint's port + r (an inproc name gets a `_dp<r>` suffix)."""
    if data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + data_parallel_rank}"


class ZmqEventPublisher:
    """One DP rank's publisher. Sends on the caller's thread: a PUB socket never blocks (it
    drops past the high-water mark, as SGLang's does), so no publishing thread is needed."""

    def __init__(self, config: KVEventsConfig, attn_dp_rank: int) -> None:
        if config.replay_endpoint:
            logger.warning("kv events: the stand-in does not serve replay_endpoint %s", config.replay_endpoint)
        self.endpoint = offset_endpoint_port(config.endpoint, attn_dp_rank)
        self._attn_dp_rank = attn_dp_rank
        self._topic = config.topic.encode()
        self._sequence = count()
        self._encoder = msgspec.msgpack.Encoder()
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(config.hwm)
        self._socket.setsockopt(zmq.LINGER, 0)
        wildcard = "*" in self.endpoint or "::" in self.endpoint
        if wildcard or self.endpoint.startswith(("ipc://", "inproc://")):
            self._socket.bind(self.endpoint)
        else:
            self._socket.connect(self.endpoint)

    def publish(self, events: list[BlockStored | AllBlocksCleared]) -> None:
        batch = KVEventBatch(ts=time.time(), events=events, attn_dp_rank=self._attn_dp_rank)
        sequence = next(self._sequence).to_bytes(8, "big")
        self._socket.send_multipart((self._topic, sequence, self._encoder.encode(batch)))

    def close(self) -> None:
        self._socket.close(linger=0)

"""One DP rank's radix cache, as far as anything outside SGLang can see it.

What SGLang's RadixCache shows is its KV events and the `cached_tokens` of a reply. Both follow
from which pages of a token sequence are cached, so that is all this keeps:

- Tokens are cached a page (`--page-size` tokens) at a time; a trailing partial page is not.
- A page is named by a SHA-256 chain: the digest of the previous page's digest followed by the
  page's token ids as 4-byte little-endian integers. On the wire a page is the first 8 bytes of
  its digest as a signed 64-bit integer. Being a chain from the root, the name depends on the
  whole prefix, as SGLang's position-aware page hashes do.
- Inserting a sequence publishes one `BlockStored` per page not yet cached, in order, each with
  the previous page as its parent (None for the first page of a sequence), in one batch; a
  sequence already cached publishes nothing.
- A reset (start-up, /flush_cache) publishes `AllBlocksCleared`. SGLang queues one when its cache
  is created and sends it with the first batch, so the first batch here leads with it too.
- A request's cached tokens are the cached prefix of its prompt without the last token (SGLang
  always computes at least one), in whole pages.
"""

from __future__ import annotations

import hashlib

from sglang.srt.disaggregation.kv_events import MEDIUM_GPU, AllBlocksCleared, BlockStored, ZmqEventPublisher


def _as_int64(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "big", signed=True)


def page_digests(token_ids: list[int], page_size: int) -> list[bytes]:
    """The chained digest of every whole page of `token_ids`."""
    digests: list[bytes] = []
    previous = b""
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        hasher = hashlib.sha256(previous)
        for token in token_ids[start : start + page_size]:
            hasher.update(token.to_bytes(4, "little"))
        previous = hasher.digest()
        digests.append(previous)
    return digests


class PrefixCache:
    """The pages a rank has cached, and the events that say so."""

    def __init__(self, page_size: int, publisher: ZmqEventPublisher | None) -> None:
        self.page_size = page_size
        self._publisher = publisher
        self._pages: set[bytes] = set()
        self._clear_pending = True

    def cached_prefix_length(self, prompt_ids: list[int]) -> int:
        """How many leading prompt tokens a new request would find cached."""
        matched = 0
        for digest in page_digests(prompt_ids[:-1], self.page_size):
            if digest not in self._pages:
                break
            matched += self.page_size
        return matched

    def insert(self, token_ids: list[int]) -> None:
        """Cache the whole pages of `token_ids`, publishing the new ones."""
        events: list[BlockStored | AllBlocksCleared] = []
        parent: int | None = None
        for index, digest in enumerate(page_digests(token_ids, self.page_size)):
            name = _as_int64(digest)
            if digest not in self._pages:
                self._pages.add(digest)
                page = token_ids[index * self.page_size : (index + 1) * self.page_size]
                events.append(
                    BlockStored(
                        block_hashes=[name],
                        parent_block_hash=parent,
                        token_ids=page,
                        block_size=len(page),
                        lora_id=None,
                        medium=MEDIUM_GPU,
                    )
                )
            parent = name
        self._publish(events)

    def clear(self) -> None:
        self._pages.clear()
        self._clear_pending = True
        self._publish([])

    def _publish(self, events: list[BlockStored | AllBlocksCleared]) -> None:
        if self._clear_pending:
            events = [AllBlocksCleared(), *events]
        if not events or self._publisher is None:
            return
        self._publisher.publish(events)
        self._clear_pending = False

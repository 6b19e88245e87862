"""The model the stand-in serves: a real tokenizer, and no weights.

Prompts are tokenized as the Infera router's BlockHasher tokenizes them (the chat template with
the generation prompt, rendered to text, then encoded without special tokens; a completions
prompt encoded as is), with the tokenizer SGLang would load (--tokenizer-path, else
--model-path), so the KV events name the pages the router hashes and a repeated prompt is a
prefix-cache hit there.

The reply is made up: real one-token words of the vocabulary, picked deterministically from the
prompt (the same prompt gets the same reply, like greedy decoding), so that token ids, text and
token counts agree as a real model's would.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from sglang.srt.server_args import ServerArgs

# Markers of a token that starts a new word: byte-level BPE (GPT-2, Qwen) and SentencePiece.
WORD_START_MARKERS = ("\u0120", "\u2581")
MIN_WORD_LETTERS = 3
REPLY_VOCABULARY_SIZE = 64


class PromptError(ValueError):
    """A request whose prompt cannot be tokenized (SGLang answers 400)."""


class Model:
    def __init__(self, server_args: ServerArgs) -> None:
        self.path = server_args.tokenizer_path or server_args.model_path
        self.tokenizer = AutoTokenizer.from_pretrained(self.path, trust_remote_code=bool(server_args.trust_remote_code))
        self.context_length = self._context_length(server_args)
        self.reply_token_ids = self._reply_token_ids()

    def _context_length(self, server_args: ServerArgs) -> int:
        """--context-length, else the model config's max_position_embeddings, else the
        tokenizer's limit."""
        if server_args.context_length:
            return int(server_args.context_length)
        config = Path(server_args.model_path) / "config.json"
        if config.is_file():
            positions = json.loads(config.read_text()).get("max_position_embeddings")
            if positions:
                return int(positions)
        return int(self.tokenizer.model_max_length)

    def _reply_token_ids(self) -> list[int]:
        """Vocabulary tokens that are a whole word with its leading space, leaving out those that
        only begin a longer one (BPE's intermediate merges); any non-special token when the
        vocabulary has no such word."""
        vocabulary = self.tokenizer.get_vocab()
        special = set(self.tokenizer.all_special_ids)
        words = sorted(
            token
            for token, token_id in vocabulary.items()
            if token[:1] in WORD_START_MARKERS
            and token[1:].isascii()
            and token[1:].isalpha()
            and len(token) > MIN_WORD_LETTERS
            and token_id not in special
        )
        # In sorted order a token that begins another one is followed by such a one.
        whole = [
            token for token, following in zip(words, [*words[1:], ""], strict=True) if not following.startswith(token)
        ]
        chosen = [vocabulary[token] for token in whole] or [
            token_id for token_id in vocabulary.values() if token_id not in special
        ]
        return sorted(chosen)[:REPLY_VOCABULARY_SIZE]

    def encode_messages(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as error:  # a template error is the request's fault, as in SGLang
            raise PromptError(f"cannot apply the chat template: {error}") from error
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_prompt(self, prompt: Any) -> list[int]:
        """A completions prompt: text, one text in a list, or token ids."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, list) and prompt and all(type(token) is int for token in prompt):
            vocabulary_size = len(self.tokenizer)
            if not all(0 <= token < vocabulary_size for token in prompt):
                raise PromptError(f"token ids must be in [0, {vocabulary_size})")
            return list(prompt)
        raise PromptError(
            "prompt must be a non-empty string or a list of token ids (the stand-in serves one prompt per request)"
        )

    def reply(self, prompt_ids: list[int], length: int, choice: int) -> list[int]:
        """The token ids a request generates: `length` words, the same for the same prompt."""
        start = zlib.crc32(json.dumps(prompt_ids).encode()) + choice
        return [self.reply_token_ids[(start + step) % len(self.reply_token_ids)] for step in range(length)]

    def text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

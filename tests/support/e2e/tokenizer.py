"""A tiny HuggingFace model directory, written offline, for the end-to-end tests.

The same directory is the engines' `--model-path` and the router's `--router-tokenizer-path`, so
the router's block hashes and the engine's KV events are computed from one tokenizer, as they are
in production when both point at one model. Nothing in it can reach the network: there are no
weights and no remote code, and every file a loader looks for is present.

The tokenizer is byte-level BPE, so any text (the runtime's canary has Chinese and an emoji)
round-trips and two different prompts never collapse into the same ids, as they would with a
word-level vocabulary and an unknown token. Its only merges spell out `WORDS`, each with its
leading space, as single tokens: that keeps prompts short and gives the stand-in engine real
one-token words to generate. The chat template is ChatML, with the special tokens the runtime's
tokenizer canary contains.
"""

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
WORDS = tuple(
    "the quick brown fox jumps over lazy dog hello world stand in engine answers every prompt "
    "with a few small words and tokens from tiny model cache prefix route request reply done".split()
)
# The symbol that stands for a space in a byte-level BPE vocabulary.
SPACE = "\u0120"
CONTEXT_LENGTH = 4096

# ChatML; `content` may be a string, OpenAI content parts (the text parts count) or null (an
# assistant turn that only calls tools).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _byte_level_bpe() -> Tokenizer:
    """Every byte a token, plus one token per `WORDS` entry preceded by a space."""
    vocab = {symbol: index for index, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges: list[tuple[str, str]] = []
    for word in WORDS:
        spelled = SPACE + word
        for end in range(2, len(spelled) + 1):
            if spelled[:end] not in vocab:
                vocab[spelled[:end]] = len(vocab)
                merges.append((spelled[: end - 1], spelled[end - 1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    return tokenizer


def build_tokenizer(directory: Path) -> Path:
    """Write the model directory (tokenizer.json, tokenizer_config.json with the chat template,
    config.json) into `directory`, creating it; returns it. Deterministic: the same bytes every time,
    so every process that hashes the tokenizer (the worker's kv digest) agrees."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = _byte_level_bpe()
    tokenizer.save(str(directory / "tokenizer.json"))
    end_of_turn = tokenizer.token_to_id("<|im_end|>")
    padding = tokenizer.token_to_id("<|endoftext|>")
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": CONTEXT_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    # A model config so AutoConfig (the router's chat-encoding probe) and an engine reading the
    # context length find one locally. Llama, not a ChatML family such as Qwen2: transformers 5
    # picks the tokenizer class from the model type, and Llama's is the generic one that uses
    # tokenizer.json as written rather than rebuilding it.
    model_config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": CONTEXT_LENGTH,
        "bos_token_id": None,
        "eos_token_id": end_of_turn,
        "pad_token_id": padding,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }
    for name, content in (
        ("tokenizer_config.json", tokenizer_config),
        ("config.json", model_config),
    ):
        (directory / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")
    return directory

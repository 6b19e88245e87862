"""Stand-in for `vllm.entrypoints.openai.cli_args.make_arg_parser`: vLLM 0.25.1's option strings.

They are read from `<INFERA_SHARED_DIR>/upstream/runtime/vllm-0.25.1-options.json`, every option
string of the 0.25.1 wheel, with existence only: each takes at most one value (a flag stores
True), and each `--x` also has its BooleanOptionalAction `--no-x`. The few options the Infera
wrapper reads get vLLM's types: `--kv-transfer-config` is JSON, as vLLM parses it into a
KVTransferConfig whose fields the wrapper reads as attributes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

OPTIONS_FILE = Path("upstream") / "runtime" / "vllm-0.25.1-options.json"
# tests/support/e2e/standins/vllm/entrypoints/openai/cli_args.py -> the project, whose sibling is shared/.
DEFAULT_SHARED_DIR = Path(__file__).resolve().parents[7].parent / "shared"


def kv_transfer_config(text: str) -> SimpleNamespace:
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return SimpleNamespace(**parsed)


TYPED: dict[str, dict[str, Any]] = {
    "--model": {"type": str},
    "--host": {"type": str},
    "--port": {"type": int, "default": 8000},
    "--served-model-name": {"nargs": "+"},
    "--block-size": {"type": int},
    "--data-parallel-size": {"type": int, "default": 1},
    "--data-parallel-rank": {"type": int},
    "--kv-transfer-config": {"type": kv_transfer_config},
}


# Read once, at import: a caller may later run a parser under a container's environment.
OPTIONS = Path(os.environ.get("INFERA_SHARED_DIR", DEFAULT_SHARED_DIR)) / OPTIONS_FILE


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    options = json.loads(OPTIONS.read_text())["options"]
    for option in options:
        parser.add_argument(option, **TYPED.get(option, {"nargs": "?", "const": True}))
    for option in sorted({f"--no-{o[2:]}" for o in options if o.startswith("--")} - set(options)):
        parser.add_argument(option, action="store_const", const=False)
    return parser

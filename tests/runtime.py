"""The Infera runtime's own argument parsers, loaded from ../shared/upstream/runtime as they are.

The runtime is read, never copied: INFERA_SHARED_DIR (default ../shared) must hold it. Only the
engines themselves are stood in for, since SGLang and vLLM need GPUs:

- `sglang.srt.server_args.ServerArgs`, whose `add_cli_args` adds every SGLang 0.5.17 option
  with the value type, nargs and choices recorded in sglang-0.5.17-options.json, and what the
  list does not record of the options the wrapper relies on: `--model-path` is required, SGLang
  binds 127.0.0.1:30000 unless told otherwise, and a prefill engine's bootstrap server 8998;
- `vllm.entrypoints.openai.cli_args.make_arg_parser`, which adds every vLLM 0.25.1 option
  string of vllm-0.25.1-options.json (existence only: each takes at most one value, the
  BooleanOptionalAction `--no-` forms too), with the few the wrapper reads typed as vLLM types
  them (`--kv-transfer-config` is JSON, as vLLM parses it into a KVTransferConfig);
- `infera.router.policy.factory.POLICY_NAMES` when the runtime's own dependencies (zmq, msgspec,
  ...) are not installed: the keys of `_BUILDERS`, read from that file.
"""

import argparse
import ast
import contextlib
import importlib
import io
import json
import os
import sys
import types
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from tests.conftest import SHARED, need

RUNTIME = SHARED / "upstream" / "runtime"
SERVER, EPP, SGLANG, VLLM = "infera.server", "infera.gaie", "infera.engine.sglang", "infera.engine.vllm"
PARSERS = {
    SERVER: ("infera.server.args", "parse_server_args"),
    EPP: ("infera.gaie.args", "parse_epp_args"),
    SGLANG: ("infera.engine.sglang.args", "parse_sglang_args"),
    VLLM: ("infera.engine.vllm.args", "parse_vllm_args"),
}


class Refused(Exception):
    """The entry point exits at start-up (argparse's exit 2, or a SystemExit of its own)."""


def need_runtime() -> Path:
    need(
        (RUNTIME / "infera" / "server" / "args.py").is_file(),
        f"the Infera runtime is not at {RUNTIME}: set INFERA_SHARED_DIR to the folder holding upstream/runtime "
        "(AMD-AGI/Infera 5890f7f with the SGLang and vLLM option lists, see ../shared/upstream/README.md)",
    )
    return RUNTIME


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


SGLANG_UNRECORDED = {
    "--model-path": {"required": True},
    "--host": {"default": "127.0.0.1"},
    "--port": {"default": 30000},
    "--disaggregation-bootstrap-port": {"default": 8998},
}


def _sglang_server_args() -> type:
    actions = json.loads((RUNTIME / "sglang-0.5.17-options.json").read_text())["actions"]
    types_by_name = {"str": str, "int": int, "float": float}

    class ServerArgs:
        @staticmethod
        def add_cli_args(parser: argparse.ArgumentParser) -> None:
            for action in actions:
                options = action["options"]
                if action.get("nargs") == 0:
                    parser.add_argument(*options, action="store_const", const=True)
                    continue
                kwargs: dict[str, Any] = dict(SGLANG_UNRECORDED.get(options[0], {}))
                if action.get("type") in types_by_name:
                    kwargs["type"] = types_by_name[action["type"]]
                if action.get("nargs") is not None:
                    kwargs["nargs"] = action["nargs"]
                if action.get("choices") is not None:
                    kwargs["choices"] = action["choices"]
                parser.add_argument(*options, **kwargs)

        @classmethod
        def from_cli_args(cls, namespace: argparse.Namespace) -> "ServerArgs":
            server_args = cls()
            server_args.__dict__.update(vars(namespace))
            return server_args

    return ServerArgs


def _kv_transfer_config(text: str) -> types.SimpleNamespace:
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("not a JSON object")
    return types.SimpleNamespace(**parsed)


VLLM_TYPED = {
    "--model": {"type": str},
    "--host": {"type": str},
    "--port": {"type": int, "default": 8000},
    "--served-model-name": {"nargs": "+"},
    "--block-size": {"type": int},
    "--data-parallel-size": {"type": int, "default": 1},
    "--data-parallel-rank": {"type": int},
    "--kv-transfer-config": {"type": _kv_transfer_config},
}


def _vllm_make_arg_parser() -> Any:
    options = json.loads((RUNTIME / "vllm-0.25.1-options.json").read_text())["options"]
    negatives = {f"--no-{option[2:]}" for option in options if option.startswith("--")} - set(options)

    def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        for option in options:
            parser.add_argument(option, **VLLM_TYPED.get(option, {"nargs": "?", "const": True}))
        for option in sorted(negatives):
            parser.add_argument(option, action="store_const", const=False)
        return parser

    return make_arg_parser


def _policy_names() -> list[str]:
    tree = ast.parse((RUNTIME / "infera" / "router" / "policy" / "factory.py").read_text())
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "_BUILDERS" and isinstance(node.value, ast.Dict):
            return sorted(key.value for key in node.value.keys)
    raise AssertionError("no _BUILDERS in infera/router/policy/factory.py")


@cache
def _install() -> None:
    sys.path.insert(0, str(RUNTIME))
    sys.modules.update({
        "sglang": _module("sglang"),
        "sglang.srt": _module("sglang.srt"),
        "sglang.srt.server_args": _module("sglang.srt.server_args", ServerArgs=_sglang_server_args()),
        "vllm": _module("vllm"),
        "vllm.entrypoints": _module("vllm.entrypoints"),
        "vllm.entrypoints.openai": _module("vllm.entrypoints.openai"),
        "vllm.entrypoints.openai.cli_args": _module("vllm.entrypoints.openai.cli_args", make_arg_parser=_vllm_make_arg_parser()),
    })
    try:
        importlib.import_module("infera.router.policy.factory")
    except ImportError:
        sys.modules["infera.router.policy.factory"] = _module("infera.router.policy.factory", POLICY_NAMES=_policy_names())


def load(module: str) -> types.ModuleType:
    """A runtime module, e.g. infera.common.disagg_preflight."""
    need_runtime()
    _install()
    return importlib.import_module(module)


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """The process environment of a container (the parsers read defaults from it)."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def parse(module: str, argv: list[str], env: dict[str, str]) -> Any:
    """What the entry point's own parser makes of `argv` under `env`; Refused with its message."""
    parser_module, function = PARSERS[module]
    parse_args = getattr(load(parser_module), function)
    errors = io.StringIO()
    with environment(env), contextlib.redirect_stderr(errors):
        try:
            return parse_args(argv)
        except SystemExit as exit_:
            # argparse prints its usage first; the last line says what is wrong.
            said = errors.getvalue().strip().splitlines()
            raise Refused(f"python3 -m {module} exits ({exit_.code}): {said[-1] if said else exit_.code}") from None

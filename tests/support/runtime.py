"""The Infera runtime's own argument parsers, loaded from ../shared/upstream/runtime as they are.

The runtime is read, never copied: INFERA_SHARED_DIR (default ../shared) must hold it, and its
dependencies are installed with the test extra. Only the engines themselves are stood in for,
since SGLang and vLLM need GPUs: tests/support/e2e/standins holds `sglang.srt.server_args` and
`vllm.entrypoints.openai.cli_args`, whose command lines are SGLang 0.5.17's and vLLM 0.25.1's as
recorded in the option lists beside the runtime (the same stand-ins the end-to-end tests run).
"""

import contextlib
import importlib
import io
import os
import sys
import types
from collections.abc import Iterator
from functools import cache
from typing import Any

from tests.support.prerequisites import REPO, RUNTIME, need_runtime

STANDINS = REPO / "tests" / "support" / "e2e" / "standins"
SERVER, EPP, SGLANG, VLLM = "infera.server", "infera.gaie", "infera.engine.sglang", "infera.engine.vllm"
PARSERS = {
    SERVER: ("infera.server.args", "parse_server_args"),
    EPP: ("infera.gaie.args", "parse_epp_args"),
    SGLANG: ("infera.engine.sglang.args", "parse_sglang_args"),
    VLLM: ("infera.engine.vllm.args", "parse_vllm_args"),
}


class Refused(Exception):
    """The entry point exits at start-up (argparse's exit 2, or a SystemExit of its own)."""


@cache
def _install() -> None:
    sys.path[:0] = [str(RUNTIME), str(STANDINS)]
    # They find their option lists from INFERA_SHARED_DIR as they load: before any parse runs
    # under a container's environment.
    importlib.import_module("sglang.srt.server_args")
    importlib.import_module("vllm.entrypoints.openai.cli_args")


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

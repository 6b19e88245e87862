"""Stand-in for `sglang.srt.server_args`: SGLang 0.5.17's command line, as argparse sees it.

The options are not written out here but read from SGLang's own record of them,
`<INFERA_SHARED_DIR>/upstream/runtime/sglang-0.5.17-options.json` (taken from the 0.5.17 wheel's
`ServerArgs.add_cli_args`): every option string, whether it takes a value, nargs, type and
choices. So an option SGLang does not have is refused, and one it has is accepted with the value
SGLang would accept, which is what a test of the Infera wrapper's argument handling needs. What
SGLang checks after parsing (ServerArgs.__post_init__, against a model and the hardware) is not
modelled.

The record leaves out defaults and `required`. `UNRECORDED` adds those the wrapper and the
stand-in engine read, with SGLang 0.5.17's values; every other option defaults to None (False for
a flag), as SGLang's do before it resolves them for a model.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

OPTIONS_FILE = Path("upstream") / "runtime" / "sglang-0.5.17-options.json"
# tests/support/e2e/standins/sglang/srt/server_args.py -> the project, whose sibling is shared/.
DEFAULT_SHARED_DIR = Path(__file__).resolve().parents[6].parent / "shared"

VALUE_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}

# Keyed by the first option string of an action in the record.
UNRECORDED: dict[str, dict[str, Any]] = {
    "--model-path": {"required": True},
    "--host": {"default": "127.0.0.1"},
    "--port": {"default": 30000},
    # SGLang resolves a None page size to 1 before anything reads it; the wrapper registers
    # `server_args.page_size` as the worker's KV block size, so it must never be None.
    "--page-size": {"default": 1},
    "--dp-size": {"default": 1},
    "--node-rank": {"default": 0},
    "--kv-cache-dtype": {"default": "auto"},
    "--hicache-ratio": {"default": 2.0},
    "--hicache-size": {"default": 0},
    "--disaggregation-mode": {"default": "null"},
    "--disaggregation-transfer-backend": {"default": "mooncake"},
    "--disaggregation-bootstrap-port": {"default": 8998},
}


# Where SGLang's option record is: under INFERA_SHARED_DIR, else the project's ../shared. Read
# once, at import: a caller may later run a parser under a container's environment.
OPTIONS = Path(os.environ.get("INFERA_SHARED_DIR", DEFAULT_SHARED_DIR)) / OPTIONS_FILE


@cache
def recorded_actions() -> tuple[dict[str, Any], ...]:
    """SGLang 0.5.17's argparse actions, as recorded; fails loudly when the record is missing or
    no longer has an option UNRECORDED describes."""
    path = OPTIONS
    if not path.is_file():
        raise FileNotFoundError(f"SGLang's option record is not at {path} (set INFERA_SHARED_DIR)")
    actions = tuple(json.loads(path.read_text())["actions"])
    firsts = {action["options"][0] for action in actions}
    missing = sorted(set(UNRECORDED) - firsts)
    if missing:
        raise ValueError(f"{path} has no {missing}: the stand-in's defaults are for options SGLang dropped")
    return actions


def _negated_pair(options: list[str]) -> list[str] | None:
    """The positive forms of a `--x`/`--no-x` pair (argparse.BooleanOptionalAction), else None."""
    positives = [option for option in options if not option.startswith("--no-")]
    negatives = {option for option in options if option.startswith("--no-")}
    if positives and negatives == {f"--no-{option[2:]}" for option in positives}:
        return positives
    return None


class ServerArgs:
    """The parsed command line: one attribute per option, named by its argparse dest, as
    SGLang's `ServerArgs` dataclass has them."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        return f"ServerArgs({', '.join(f'{name}={value!r}' for name, value in sorted(vars(self).items()))})"

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        """Add every SGLang 0.5.17 option to `parser`: a flag (nargs 0) stores True, or False
        for the `--no-` form of a pair; an option with a value is typed, counted and restricted
        as recorded."""
        for action in recorded_actions():
            options = action["options"]
            extra = UNRECORDED.get(options[0], {})
            if action.get("nargs") == 0:
                positives = _negated_pair(options)
                if positives is not None:
                    parser.add_argument(*positives, action=argparse.BooleanOptionalAction, **extra)
                else:
                    parser.add_argument(*options, action="store_true", **extra)
                continue
            kwargs: dict[str, Any] = dict(extra)
            if action.get("type") in VALUE_TYPES:
                kwargs["type"] = VALUE_TYPES[action["type"]]
            if action.get("nargs") is not None:
                kwargs["nargs"] = action["nargs"]
            if action.get("choices") is not None:
                kwargs["choices"] = action["choices"]
            parser.add_argument(*options, **kwargs)

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> ServerArgs:
        """A ServerArgs whose attributes are the namespace's."""
        return cls(**vars(args))

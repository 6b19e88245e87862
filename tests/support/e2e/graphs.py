"""The specs the data-plane scenarios run: a router and workers of the tiny test model, whose
tokenizer tests/support/e2e/tokenizer.py builds, with the stand-in engine's flags."""

from pathlib import Path
from typing import Any

MODEL = "tiny"
PAGE_SIZE = 4  # the workers' --page-size: the engine's KV block, the router's hash block


def server(model: Path, *args: str) -> dict[str, Any]:
    return {"componentType": "server", "args": ["--router-tokenizer-path", str(model), *args]}


def worker(model: Path, role: str = "mixed", *args: str) -> dict[str, Any]:
    flags = ["--model-path", str(model), "--served-model-name", MODEL, "--page-size", str(PAGE_SIZE)]
    if role != "mixed":
        flags += ["--disaggregation-transfer-backend", "mori"]
    return {"componentType": "worker", "role": role, "args": [*flags, *args]}


def mixed(model: Path) -> dict[str, Any]:
    return {"services": {"server": server(model), "worker": worker(model)}}


def pd(model: Path) -> dict[str, Any]:
    return {
        "services": {
            "server": server(model),
            "prefill": worker(model, "prefill"),
            "decode": worker(model, "decode"),
            "mixed": worker(model),
        }
    }

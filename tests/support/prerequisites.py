"""What the tests need from outside the repository, and the one way to say it is missing.

A missing prerequisite skips the test with a reason naming it and how to get it; with
INFERA_REQUIRE_ALL=1 (set by .ci/run) it fails instead, so CI cannot pass by skipping.
"""

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("INFERA_SHARED_DIR", REPO.parent / "shared"))
SCHEMAS = Path(os.environ.get("INFERA_SCHEMAS_DIR", SHARED / "schemas"))
UPSTREAM = SHARED / "upstream"
RUNTIME = UPSTREAM / "runtime"
# How a user who cloned the repository alone gets what the tests read from SHARED.
FETCH = (
    "fetch it with `python3 tests/support/fetch_shared.py` (needs internet access) or set INFERA_SHARED_DIR to a copy"
)


def need(condition: bool, reason: str) -> None:
    """Skip (or, under INFERA_REQUIRE_ALL=1, fail) when a prerequisite is missing."""
    if condition:
        return
    if os.environ.get("INFERA_REQUIRE_ALL") == "1":
        pytest.fail(f"required prerequisite missing: {reason}")
    pytest.skip(reason)


def need_schemas() -> Path:
    """The upstream CRDs the emitted LeaderWorkerSets, InferencePools and HTTPRoutes (and our
    CompositeController) are validated against."""
    need(
        SCHEMAS.is_dir(),
        f"the upstream CRD schemas (LeaderWorkerSet, InferencePool, HTTPRoute, CompositeController) are not at "
        f"{SCHEMAS}: {FETCH} (or INFERA_SCHEMAS_DIR to the schemas alone)",
    )
    return SCHEMAS


def need_upstream() -> Path:
    """The upstream operator's CRD and examples: the compatibility corpus."""
    need(
        (UPSTREAM / "examples").is_dir() and (UPSTREAM / "infera.amd.com_inferadeployments.yaml").is_file(),
        f"the upstream Infera operator's CRD and examples (AMD-AGI/Infera 5890f7f) are not at {UPSTREAM}: {FETCH}",
    )
    return UPSTREAM


def need_runtime() -> Path:
    """The Infera runtime the pods run, with the SGLang and vLLM option lists its stand-ins read."""
    need(
        (RUNTIME / "infera" / "server" / "args.py").is_file()
        and (RUNTIME / "sglang-0.5.17-options.json").is_file()
        and (RUNTIME / "vllm-0.25.1-options.json").is_file(),
        f"the Infera runtime (AMD-AGI/Infera 5890f7f) and the SGLang and vLLM option lists are not at {RUNTIME}: {FETCH}",
    )
    return RUNTIME


@cache
def go_module_cache() -> Path:
    """Where `go mod download` puts modules: `go env GOMODCACHE` (Go on PATH or where its
    tarball installs), else Go's default ($GOMODCACHE, or $GOPATH/pkg/mod, GOPATH ~/go)."""
    go = shutil.which("go") or "/usr/local/go/bin/go"
    try:
        answer = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        answer = ""
    gopath = (os.environ.get("GOPATH") or str(Path.home() / "go")).split(os.pathsep)[0]  # Go uses the first
    return Path(answer or os.environ.get("GOMODCACHE") or Path(gopath) / "pkg" / "mod")


def go_module(module: str) -> Path:
    """The directory of `module` (path@version) in the cache, which spells an upper-case letter
    as '!' and its lower case."""
    return go_module_cache() / re.sub("[A-Z]", lambda letter: "!" + letter[0].lower(), module)


def need_go_module(module: str) -> Path:
    directory = go_module(module)
    need(directory.is_dir(), f"the Go module {module} is not downloaded (go mod download {module})")
    return directory


def need_kubectl() -> str:
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl is not on PATH")
    return kubectl

"""What the tests need from outside the repository, and the one way to say it is missing.

A missing prerequisite skips the test with a reason naming it and how to get it; with
INFERA_REQUIRE_ALL=1 (set by .ci/run) it fails instead, so CI cannot pass by skipping.
"""

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
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
    as '!' and its lower case; downloaded first through the module proxy if it is not there and
    Go is."""
    directory = go_module_cache() / re.sub("[A-Z]", lambda letter: "!" + letter[0].lower(), module)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not directory.is_dir() and Path(go).is_file():
        print(f"downloading the Go module {module}", file=sys.stderr, flush=True)
        subprocess.run([go, "mod", "download", module], cwd=REPO, capture_output=True, timeout=1800)
    return directory


def need_go_module(module: str) -> Path:
    directory = go_module(module)
    need(directory.is_dir(), f"the Go module {module} is not downloaded, and Go could not (go mod download {module})")
    return directory


# The third-party scanner the pod security tests run, in a virtualenv of its own: its pins would
# clash with the project's. Made once per machine from tests/checkov.txt, whose digest marks it.
CHECKOV_VENV = REPO / ".cache" / "checkov"
CHECKOV_PINS = REPO / "tests" / "checkov.txt"


def need_checkov() -> Path:
    """checkov, installed first into CHECKOV_VENV from its pins if it is not there yet."""
    marker = CHECKOV_VENV / "installed-from"
    pins = hashlib.sha256(CHECKOV_PINS.read_bytes()).hexdigest()
    if not marker.is_file() or marker.read_text() != pins:
        print(f"installing checkov into {CHECKOV_VENV}: about a minute", file=sys.stderr, flush=True)
        shutil.rmtree(CHECKOV_VENV, ignore_errors=True)
        made = subprocess.run(
            f"{shlex.quote(sys.executable)} -m venv {shlex.quote(str(CHECKOV_VENV))} && "
            f"{shlex.quote(str(CHECKOV_VENV / 'bin' / 'pip'))} install -q -r {shlex.quote(str(CHECKOV_PINS))}",
            shell=True,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        need(made.returncode == 0, f"checkov could not be installed from {CHECKOV_PINS}: {made.stderr[-2000:]}")
        marker.write_text(pins)
    return CHECKOV_VENV / "bin" / "checkov"


def need_kubectl() -> str:
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl is not on PATH")
    return kubectl

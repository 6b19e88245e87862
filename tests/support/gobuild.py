"""Programs the tests run, built from Go modules a go.mod of the tests pins (published modules
through the module proxy, nothing vendored), or from a release's source tree (Metacontroller's).

Each set is built once per machine into .cache/<name>/<key>/bin (gitignored), the key a digest
of the module folder's files (a go.mod and go.sum, or the whole source tree), the programs, the
link flags and the Go version, so a version change builds afresh and a repeated run builds
nothing. Go's own caches stay where Go keeps them.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.prerequisites import REPO, need


def go() -> str | None:
    """Go on PATH, or where its release tarball installs."""
    return shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)


def _built_name(package: str) -> str:
    """What `go build -o DIR` names a package's binary: its last path element, or the one
    before a major-version suffix (`cmd` for LWS, `server` for etcd)."""
    parts = package.split("/")
    return parts[-2] if re.fullmatch(r"v[0-9]+", parts[-1]) else parts[-1]


def _key(go_binary: str, module: Path, programs: dict[str, str], ldflags: str) -> str:
    version = subprocess.run([go_binary, "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout
    digest = hashlib.sha256(version.encode())
    for path in sorted(path for path in module.rglob("*") if path.is_file()):
        digest.update(path.read_bytes())
    digest.update(repr(sorted(programs.items())).encode() + ldflags.encode())
    return digest.hexdigest()[:16]


def built(
    name: str,
    programs: dict[str, str],
    ldflags: str = "",
    cold_build: str = "",
    module: Path | None = None,
    goflags: str = "",
) -> dict[str, Path]:
    """The programs (installed name -> main package) of the module tests/<name>, or of the
    source tree `module` (only read, but with `goflags` -mod=mod, which lets Go complete its
    go.mod), each path built first if this machine has not built these versions yet;
    `cold_build` says on stderr how long a build takes when Go's build cache is cold."""
    go_binary = go()
    need(go_binary is not None, f"Go (1.26 or newer) builds {', '.join(programs)}: install it from go.dev/dl")
    assert go_binary is not None
    module = module or REPO / "tests" / name
    bin_dir = REPO / ".cache" / name / _key(go_binary, module, programs, ldflags) / "bin"
    paths = {program: bin_dir / program for program in programs}
    if all(path.is_file() for path in paths.values()):
        return paths
    building = bin_dir.with_name("bin.partial")
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    print(f"building {', '.join(programs)} into {bin_dir}{cold_build}", file=sys.stderr, flush=True)
    started = time.monotonic()
    environment = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": f"-buildvcs=false {goflags}".strip()}
    subprocess.run(
        [
            go_binary,
            "build",
            "-trimpath",
            "-ldflags",
            f"-s -w {ldflags}".strip(),
            "-o",
            str(building),
            *programs.values(),
        ],
        cwd=module,
        env=environment,
        check=True,
    )
    for program, package in programs.items():
        (building / _built_name(package)).rename(building / program)
    shutil.rmtree(bin_dir, ignore_errors=True)  # a build interrupted after its rename began
    building.rename(bin_dir)
    print(f"built {', '.join(programs)} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return paths

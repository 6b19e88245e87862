"""Fetch the reference data the tests read from INFERA_SHARED_DIR (default: <repo>/../shared).

    python tests/support/fetch_shared.py [--into DIR]

writes DIR/schemas/ (the CRDs of LeaderWorkerSet, InferencePool, HTTPRoute, Metacontroller's controllers and
the Prometheus Operator's PodMonitor, ServiceMonitor and PrometheusRule, each from its project's release), DIR/upstream/ (AMD-AGI/Infera at commit 5890f7f: its CRD, examples,
operator sources, runtime and manual pages, and the SGLang 0.5.17 and vLLM 0.25.1 option lists, generated
from their PyPI wheels) and DIR/metacontroller/source/ (Metacontroller's v4.17.2 release: the files its build
and install use, each checked against tests/metacontroller/SHA256SUMS). Everything is downloaded into a staging folder under DIR and moved into place at
the end, so an interrupted run leaves DIR as it was. A folder that already holds the fetched files is left
untouched, which makes a second run a no-op. Standard library only.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

HERE = Path(__file__).resolve().parent
DEFAULT_INTO = HERE.parents[2] / "shared"
GITHUB_RAW = "https://raw.githubusercontent.com"
GITHUB_ARCHIVE = "https://codeload.github.com"
TIMEOUT_S = 60

# schemas/<file>: (project, release tag, path in the project), as ../shared/schemas/README.md gives them.
SCHEMAS: dict[str, tuple[str, str, str]] = {
    "lws.yaml": ("kubernetes-sigs/lws", "v0.10.0", "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"),
    "inferencepool.yaml": (
        "kubernetes-sigs/gateway-api-inference-extension",
        "v1.6.0",
        "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
    ),
    "httproute.yaml": (
        "kubernetes-sigs/gateway-api",
        "v1.6.1",
        "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml",
    ),
    "metacontroller-crds.yaml": (
        "metacontroller/metacontroller",
        "v4.17.2",
        "manifests/production/metacontroller-crds-v1.yaml",
    ),
    **{
        f"{kind}.yaml": (
            "prometheus-operator/prometheus-operator",
            "v0.93.0",
            f"example/prometheus-operator-crd/monitoring.coreos.com_{kind}s.yaml",
        )
        for kind in ("podmonitor", "servicemonitor", "prometheusrule")
    },
}

METACONTROLLER_REPO = "metacontroller/metacontroller"
METACONTROLLER_TAG = "v4.17.2"
# Every file of that release the tests build and install from, with its sha256.
METACONTROLLER_SUMS = HERE.parent / "metacontroller" / "SHA256SUMS"
METACONTROLLER_SOURCE = Path("metacontroller") / "source"

INFERA_REPO = "AMD-AGI/Infera"
INFERA_COMMIT = "5890f7f60750b17f598a1226a37c5be1fecf8045"
# (path in the Infera repository at INFERA_COMMIT, path under upstream/). A path ending in "/" is a directory
# taken whole; the others are single files, where only some of a directory's files are wanted.
INFERA_PATHS: tuple[tuple[str, str], ...] = (
    ("deploy/operator/config/crd/bases/infera.amd.com_inferadeployments.yaml", "infera.amd.com_inferadeployments.yaml"),
    ("deploy/operator/config/samples/", "examples/"),
    # The example manifests, flattened into examples/ (model-cache/ included), without the folder's own docs.
    *(
        (f"examples/k8s-deployments/{path}", f"examples/{PurePosixPath(path).name}")
        for path in (
            "glm5.2-sglang.yaml",
            "kgateway-gaie-aggregated.yaml",
            "kimi-k3-vllm.yaml",
            "mixed-kvd-vllm.yaml",
            "mixed-kvd.yaml",
            "model-cache/model-cache.yaml",
            "model-cache/model-download.yaml",
            "multinode-tp-aggregated.yaml",
            "pd-1p1d-mooncake.yaml",
            "pd-disaggregated.yaml",
            "pd-kvd.yaml",
            "pvc-models.yaml",
            "single-node-aggregated.yaml",
            "single-node-qwen-sglang.yaml",
            "single-node-qwen-vllm.yaml",
        )
    ),
    # The operator as a Go module that builds (`go build ./cmd`): the peer the benchmarks run.
    *(
        (f"deploy/operator/{path}", f"operator/{path}")
        for path in (
            "README.md",
            "go.mod",
            "go.sum",
            "cmd/main.go",
            "api/v1alpha1/groupversion_info.go",
            "api/v1alpha1/inferadeployment_types.go",
            "api/v1alpha1/zz_generated.deepcopy.go",
            "config/rbac/role.yaml",
            "internal/mn-idle.sh",
            "internal/mn-sshd-init.sh",
            "internal/controller/apply_idempotence_test.go",
            "internal/controller/builders.go",
            "internal/controller/builders_test.go",
            "internal/controller/discovery_backend_test.go",
            "internal/controller/gaie.go",
            "internal/controller/inferadeployment_controller.go",
            "internal/controller/nats.go",
            "internal/controller/scale_paths_test.go",
            "internal/controller/status_rollup_test.go",
            "internal/controller/watches_test.go",
        )
    ),
    ("infera/", "runtime/infera/"),
    ("pyproject.toml", "runtime/pyproject.toml"),
    ("LICENSE", "runtime/LICENSE"),
    *(
        (f"manual/{path}", f"manual/{path}")
        for path in (
            "components/engines.md",
            "components/operator.md",
            "components/server.md",
            "features/graceful_shutdown.md",
            "features/kv_aware_routing.md",
            "features/pd_disaggregation.md",
            "features/routing_and_transport.md",
            "features/scaling.md",
        )
    ),
)

# The engines' option lists are no file of any repository: they are generated from these wheels (any one
# of SGLang's per-Python wheels would do, the sources read are the same), pinned by sha256.
SGLANG_WHEEL = (
    "https://files.pythonhosted.org/packages/57/8f/e6a8f144d1732717d5c848fa24b0a52013804a21258872cb92bfb87fd30a/"
    "sglang-0.5.17-cp312-cp312-manylinux_2_34_x86_64.whl",
    "fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093",
)
VLLM_WHEEL = (
    "https://files.pythonhosted.org/packages/35/9d/c379618ce0abfc2679607d403c0f586b07e9c9c33d08c5bdd6196cb524e0/"
    "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl",
    "16fc7a28df1576eb6f7ca0455026551b8f9adb674c19c66059359ef3e964bd1e",
)
SGLANG_OPTIONS = "runtime/sglang-0.5.17-options.json"
VLLM_OPTIONS = "runtime/vllm-0.25.1-options.json"
SGLANG_SOURCE = "sglang 0.5.17 (PyPI wheel), ServerArgs.add_cli_args, as built by argparse"
VLLM_SOURCE = (
    "option strings found in the vllm 0.25.1 wheel (arg_utils.py, cli_args.py, FrontendArgs); existence only, "
    "no value types"
)
# The wheel's modules that run for real; every other import of server_args.py is a stub (_Stub).
SGLANG_MODULES = {
    "sglang.srt.server_args": "sglang/srt/server_args.py",
    "sglang.srt.arg_groups.arg_utils": "sglang/srt/arg_groups/arg_utils.py",
    "sglang.srt.arg_groups.argparse_actions": "sglang/srt/arg_groups/argparse_actions.py",
}
# Stubbed names that the record was made with a value for (the wheel's own LoRA module list is longer).
SGLANG_STUB_VALUES: dict[str, dict[str, Any]] = {
    "sglang.srt.utils.common": {
        "SUPPORTED_LORA_TARGET_MODULES": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "LORA_TARGET_ALL_MODULES": "all",
    },
}
# SGLang keeps some choices in a set, whose order follows the string hash: this seed gives the record's
# order (CPython 3.11 and later hash strings alike).
SGLANG_HASH_SEED = "4"
VALUE_TYPES = {str: "str", int: "int", float: "float"}


class FetchError(Exception):
    """A download or its content failed; the message names the URL."""


@contextlib.contextmanager
def opened(url: str) -> Iterator[IO[bytes]]:
    """The body of `url`. A network or HTTP failure, while opening or while the caller reads, is a FetchError."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            yield response
    except urllib.error.HTTPError as error:
        raise FetchError(f"cannot fetch {url}: HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise FetchError(f"cannot fetch {url}: {error.reason}") from None
    # A connection dropped mid-archive surfaces as a truncated or corrupt stream.
    except (OSError, EOFError, tarfile.TarError, zlib.error) as error:
        raise FetchError(f"cannot fetch {url}: {error}") from None


def fetch_schemas(into: Path, github_raw: str) -> None:
    for name, (project, tag, path) in SCHEMAS.items():
        url = f"{github_raw}/{project}/{tag}/{path}"
        with opened(url) as response:
            data = response.read()
        (into / name).write_bytes(data)
        print(f"fetched schemas/{name} from {url}")


def upstream_path(repo_path: str) -> tuple[str, str] | None:
    """The INFERA_PATHS entry that takes `repo_path`, and where it goes under upstream/; None if none does."""
    for source, target in INFERA_PATHS:
        if source.endswith("/") and repo_path.startswith(source):
            return source, target + repo_path[len(source) :]
        if repo_path == source:
            return source, target
    return None


def fetch_infera(into: Path, github_archive: str) -> None:
    """One download of the tree at INFERA_COMMIT, of which only the mapped paths are written."""
    url = f"{github_archive}/{INFERA_REPO}/tar.gz/{INFERA_COMMIT}"
    found: set[str] = set()
    written = 0
    with opened(url) as response, tarfile.open(fileobj=response, mode="r|gz") as archive:
        for member in archive:
            path = PurePosixPath(member.name)
            # Refuse what could land outside `into`, whether or not it is mapped.
            if path.is_absolute() or ".." in path.parts:
                raise FetchError(f"{url}: unsafe path in the archive: {member.name}")
            # The archive holds the tree in one top folder, Infera-<commit>/.
            mapped = upstream_path(PurePosixPath(*path.parts[1:]).as_posix())
            if mapped is None or member.isdir():
                continue
            if not member.isfile():
                raise FetchError(f"{url}: {member.name} is not a regular file")
            source, target = mapped
            extracted = archive.extractfile(member)
            assert extracted is not None  # a regular file has content
            (into / target).parent.mkdir(parents=True, exist_ok=True)
            (into / target).write_bytes(extracted.read())
            found.add(source)
            written += 1
    missing = [source for source, _ in INFERA_PATHS if source not in found]
    if missing:
        raise FetchError(f"{url}: not in the archive: {', '.join(missing)}")
    print(f"fetched upstream/ ({written} files of {INFERA_REPO} at {INFERA_COMMIT[:7]}) from {url}")


def fetch_metacontroller(into: Path, github_archive: str) -> None:
    """The release's source archive, of which only the files SHA256SUMS pins are written, each
    checked against its digest."""
    url = f"{github_archive}/{METACONTROLLER_REPO}/tar.gz/refs/tags/{METACONTROLLER_TAG}"
    lines = METACONTROLLER_SUMS.read_text().splitlines()
    pinned = {path: digest for digest, path in (line.split("  ", 1) for line in lines)}
    found: set[str] = set()
    with opened(url) as response, tarfile.open(fileobj=response, mode="r|gz") as archive:
        for member in archive:
            path = PurePosixPath(member.name)
            if path.is_absolute() or ".." in path.parts:
                raise FetchError(f"{url}: unsafe path in the archive: {member.name}")
            # The archive holds the tree in one top folder, metacontroller-<version>/.
            inside = PurePosixPath(*path.parts[1:]).as_posix()
            if inside not in pinned or member.isdir():
                continue
            if not member.isfile():
                raise FetchError(f"{url}: {member.name} is not a regular file")
            extracted = archive.extractfile(member)
            assert extracted is not None  # a regular file has content
            data = extracted.read()
            digest = hashlib.sha256(data).hexdigest()
            if digest != pinned[inside]:
                raise FetchError(f"{url}: {inside} has sha256 {digest}, not the pinned {pinned[inside]}")
            (into / inside).parent.mkdir(parents=True, exist_ok=True)
            (into / inside).write_bytes(data)
            found.add(inside)
    missing = sorted(pinned.keys() - found)
    if missing:
        raise FetchError(f"{url}: not in the archive: {', '.join(missing[:5])}")
    print(
        f"fetched {METACONTROLLER_SOURCE.as_posix()}/ ({len(found)} files of {METACONTROLLER_REPO} "
        f"{METACONTROLLER_TAG}, each as {METACONTROLLER_SUMS.name} pins it) from {url}"
    )


def fetch_wheel(wheel: tuple[str, str], into: Path) -> Path:
    url, sha256 = wheel
    path = into / url.rpartition("/")[2]
    digest = hashlib.sha256()
    with opened(url) as response, path.open("wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        raise FetchError(f"{url}: sha256 is {digest.hexdigest()}, not the pinned {sha256}")
    print(f"fetched {path.name} ({path.stat().st_size / 1e6:.0f} MB, sha256 as pinned) from {url}")
    return path


def describe_parser(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """Each action of `parser` as the option records have it: its option strings, whether it takes a value
    (argparse's own flags do not; a custom action does, even with nargs 0), and its nargs, plain value type
    and choices when set. A type that is a function of its own is left out: what it accepts is its secret."""
    described = []
    for action in parser._actions:
        flag = isinstance(action, argparse._StoreConstAction | argparse.BooleanOptionalAction)
        entry: dict[str, Any] = {"options": list(action.option_strings), "takes_value": not flag}
        if action.nargs is not None:
            entry["nargs"] = action.nargs
        if action.choices is not None:
            entry["choices"] = list(action.choices)
        if action.type in VALUE_TYPES:
            entry["type"] = VALUE_TYPES[action.type]
        described.append(entry)
    return described


class _Stub:
    """Anything server_args.py imports from SGLang but the argparse helpers: truthy, empty when iterated, and
    falsy once called, so an environment switch reads off and a registry lists nothing."""

    def __init__(self, truthy: bool = True) -> None:
        self._truthy = truthy

    def __getattr__(self, name: str) -> _Stub:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub()

    def __call__(self, *args: object, **kwargs: object) -> _Stub:
        return _Stub(truthy=False)

    def __iter__(self) -> Iterator[object]:
        return iter(())

    def __bool__(self) -> bool:
        return self._truthy


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        return SGLANG_STUB_VALUES.get(self.__name__, {}).get(name, _Stub())


class _WheelImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports SGLANG_MODULES from the wheel and a _StubModule for any other module outside the standard library."""

    def __init__(self, wheel: Path) -> None:
        with zipfile.ZipFile(wheel) as archive:
            self.sources = {name: archive.read(path) for name, path in SGLANG_MODULES.items()}

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name.partition(".")[0] in sys.stdlib_module_names:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=name not in self.sources)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None if spec.name in self.sources else _StubModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ in self.sources:
            exec(compile(self.sources[module.__name__], SGLANG_MODULES[module.__name__], "exec"), module.__dict__)


def print_sglang_options(wheel: str) -> None:
    """Print the SGLang option record; run in a child process of its own (see sglang_options)."""
    sys.meta_path.insert(0, _WheelImporter(Path(wheel)))
    server_args = importlib.import_module("sglang.srt.server_args")
    parser = argparse.ArgumentParser(add_help=False)
    server_args.ServerArgs.add_cli_args(parser)
    sys.stdout.write(json.dumps({"source": SGLANG_SOURCE, "actions": describe_parser(parser)}, indent=1))


def sglang_options(wheel: Path) -> str:
    """The record of every argparse action of ServerArgs.add_cli_args, run from the wheel's sources. In a child
    process: the stubs replace modules, and the hash seed can only be set when Python starts."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import fetch_shared; fetch_shared.print_sglang_options(sys.argv[2])"
    child = subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(wheel)],
        env={**os.environ, "PYTHONHASHSEED": SGLANG_HASH_SEED},
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"ServerArgs.add_cli_args of {wheel.name} failed: {last}")
    return child.stdout


def vllm_options(wheel: Path) -> str:
    """Every option string vLLM's serve parser is built from: those quoted in arg_utils.py (short forms included),
    the long ones quoted in cli_args.py, and one per field of its FrontendArgs dataclasses."""
    with zipfile.ZipFile(wheel) as archive:
        engine = archive.read("vllm/engine/arg_utils.py").decode()
        frontend = archive.read("vllm/entrypoints/openai/cli_args.py").decode()
    options = set(re.findall(r"""["'](--?[a-z0-9][a-z0-9-]*)["']""", engine))
    options |= set(re.findall(r"""["'](--[a-z0-9][a-z0-9-]*)["']""", frontend))
    for node in ast.parse(frontend).body:
        if isinstance(node, ast.ClassDef) and node.name in ("BaseFrontendArgs", "FrontendArgs"):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    options.add("--" + stmt.target.id.replace("_", "-"))
    return json.dumps({"source": VLLM_SOURCE, "options": sorted(options)}, indent=1)


def files(root: Path) -> set[PurePosixPath]:
    return {PurePosixPath(path.relative_to(root).as_posix()) for path in root.rglob("*") if path.is_file()}


def install(staged: Path, dest: Path, trash: Path) -> None:
    """Move `staged` to `dest`, unless `dest` holds its files already. Files of `dest` that the fetch does
    not make (a README of the folder, option lists skipped this time) are kept."""
    if dest.is_dir():
        ours, theirs = files(staged), files(dest)
        if all(path in theirs and (staged / path).read_bytes() == (dest / path).read_bytes() for path in ours):
            print(f"up to date: {dest}")
            return
        for path in theirs - ours:
            (staged / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(dest / path, staged / path)
        # Two renames: in between `dest` is missing (its tests skip), never half-written.
        dest.rename(trash)
    staged.rename(dest)
    print(f"installed {dest}")


def fetch(into: Path, github_raw: str, github_archive: str, engine_options: bool) -> None:
    into.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=".fetch-", dir=into))
    try:
        (stage / "schemas").mkdir()
        fetch_schemas(stage / "schemas", github_raw)
        fetch_infera(stage / "upstream", github_archive)
        fetch_metacontroller(stage / METACONTROLLER_SOURCE, github_archive)
        if engine_options:
            (stage / "wheels").mkdir()
            sglang_wheel = fetch_wheel(SGLANG_WHEEL, stage / "wheels")
            (stage / "upstream" / SGLANG_OPTIONS).write_text(sglang_options(sglang_wheel))
            print(f"generated upstream/{SGLANG_OPTIONS}")
            vllm_wheel = fetch_wheel(VLLM_WHEEL, stage / "wheels")
            (stage / "upstream" / VLLM_OPTIONS).write_text(vllm_options(vllm_wheel))
            print(f"generated upstream/{VLLM_OPTIONS}")
        else:
            print(
                f"not generated: upstream/{SGLANG_OPTIONS} (ServerArgs.add_cli_args of the sglang 0.5.17 wheel) and "
                f"upstream/{VLLM_OPTIONS} (option strings of the vllm 0.25.1 wheel); run without --no-engine-options "
                "to download the wheels (about 270 MB) and generate them"
            )
        for name in (Path("schemas"), Path("upstream"), METACONTROLLER_SOURCE):
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            install(stage / name, into / name, stage / f"old-{name.name}")
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--into",
        type=Path,
        metavar="DIR",
        default=Path(os.environ.get("INFERA_SHARED_DIR", DEFAULT_INTO)),
        help="the shared folder (default: $INFERA_SHARED_DIR, else <repo>/../shared)",
    )
    parser.add_argument(
        "--github-raw", metavar="URL", default=GITHUB_RAW, help=f"where raw files are served (default: {GITHUB_RAW})"
    )
    parser.add_argument(
        "--github-archive",
        metavar="URL",
        default=GITHUB_ARCHIVE,
        help=f"where tarballs are served (default: {GITHUB_ARCHIVE})",
    )
    parser.add_argument(
        "--no-engine-options",
        dest="engine_options",
        action="store_false",
        help="skip the SGLang and vLLM option lists, which need their wheels (about 270 MB)",
    )
    args = parser.parse_args()
    try:
        fetch(args.into, args.github_raw.rstrip("/"), args.github_archive.rstrip("/"), args.engine_options)
    except (FetchError, OSError) as error:
        print(f"fetch_shared: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

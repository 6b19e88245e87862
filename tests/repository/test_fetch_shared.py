"""tests/support/fetch_shared.py, run as a user would, against a loopback stand-in for GitHub.

The stand-in is built from ../shared itself: each schema at its path in its project at its tag, a
tarball of AMD-AGI/Infera at the pinned commit holding each upstream file at its path in that repository,
and one of Metacontroller's release holding metacontroller/source/.
What the script writes must then be ../shared again, file for file. Nothing here goes online, so the two
engine option lists (generated from 270 MB of wheels) are left out, and the folder READMEs, which document
../shared rather than come from upstream.
"""

import argparse
import contextlib
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.support import fetch_shared
from tests.support import runtime as runtime_loader
from tests.support.prerequisites import FETCH, RUNTIME, SHARED, need, need_runtime

SCRIPT = Path(fetch_shared.__file__)
TOP = f"Infera-{fetch_shared.INFERA_COMMIT}"
ARCHIVE = f"/{fetch_shared.INFERA_REPO}/tar.gz/{fetch_shared.INFERA_COMMIT}"
MC_TOP = f"metacontroller-{fetch_shared.METACONTROLLER_TAG.removeprefix('v')}"
MC_ARCHIVE = f"/{fetch_shared.METACONTROLLER_REPO}/tar.gz/refs/tags/{fetch_shared.METACONTROLLER_TAG}"
FOLDERS = ("schemas", "upstream", fetch_shared.METACONTROLLER_SOURCE.as_posix())
FOLDER_DOCS = {Path("schemas/README.md"), Path("upstream/README.md")}
GENERATED = {Path("upstream") / fetch_shared.SGLANG_OPTIONS, Path("upstream") / fetch_shared.VLLM_OPTIONS}


def shared_files() -> dict[Path, bytes]:
    """What the script fetches without the engine wheels, as ../shared has it."""
    need(all((SHARED / folder).is_dir() for folder in FOLDERS), f"the shared folder is not at {SHARED}: {FETCH}")
    return {path: data for path, data in tree(SHARED).items() if path not in FOLDER_DOCS | GENERATED}


def tree(root: Path) -> dict[Path, bytes]:
    return {
        path.relative_to(root): path.read_bytes()
        for folder in FOLDERS
        for path in sorted((root / folder).rglob("*"))
        if path.is_file()
    }


def repo_path(upstream: str) -> str:
    """Where a file under upstream/ is in the Infera repository, by the script's table read backwards."""
    for source, target in fetch_shared.INFERA_PATHS:
        if upstream == target:
            return source
    # examples/ takes whole deploy/operator/config/samples/ and single files from examples/k8s-deployments/.
    for source, target in fetch_shared.INFERA_PATHS:
        if target.endswith("/") and upstream.startswith(target):
            return source + upstream[len(target) :]
    raise AssertionError(f"upstream/{upstream} comes from nowhere in the script's table")


def tarball(members: dict[str, bytes], extra_members: dict[str, bytes]) -> bytes:
    """A gzipped tar as GitHub's archives are: one top folder, and a member for each directory of `members`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for folder in sorted({str(parent) for name in members for parent in Path(name).parents if str(parent) != "."}):
            directory = tarfile.TarInfo(folder)
            directory.type = tarfile.DIRTYPE
            archive.addfile(directory)
        for name, data in (members | extra_members).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def github(files: dict[Path, bytes], extra_members: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """URL path -> body, for raw.githubusercontent.com and codeload.github.com at once."""
    routes = {
        f"/{project}/{tag}/{path}": files[Path("schemas") / name]
        for name, (project, tag, path) in fetch_shared.SCHEMAS.items()
    }
    members = {
        f"{TOP}/{repo_path(path.relative_to('upstream').as_posix())}": data
        for path, data in files.items()
        if path.parts[0] == "upstream"
    }
    # A file the table does not take, as the real tree has many: it must not be written.
    members[f"{TOP}/examples/k8s-deployments/README.md"] = b"not taken\n"
    routes[ARCHIVE] = tarball(members, extra_members or {})
    source = fetch_shared.METACONTROLLER_SOURCE
    release = {
        f"{MC_TOP}/{path.relative_to(source).as_posix()}": data
        for path, data in files.items()
        if path.is_relative_to(source)
    }
    # Its docs, examples and the rest of the tree: none is pinned, none is written.
    release[f"{MC_TOP}/docs/README.md"] = b"not taken\n"
    routes[MC_ARCHIVE] = tarball(release, {})
    return routes


@contextlib.contextmanager
def serving(routes: dict[str, bytes]) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = routes.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run(into: Path, base: str) -> subprocess.CompletedProcess[str]:
    """The script as a user runs it, with GitHub at `base` and without the engine wheels."""
    return subprocess.run(
        [sys.executable, SCRIPT, "--into", into, "--github-raw", base, "--github-archive", base, "--no-engine-options"],
        env={**os.environ, "no_proxy": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_fetch_writes_the_shared_folder_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    files = shared_files()
    into = tmp_path / "shared"
    with serving(github(files)) as base:
        first = run(into, base)
        assert first.returncode == 0, first.stderr
        assert tree(into) == files
        assert sorted(path.name for path in into.iterdir()) == ["metacontroller", "schemas", "upstream"]
        for name in fetch_shared.SCHEMAS:
            assert f"fetched schemas/{name} from {base}/" in first.stdout
        upstream = sum(path.parts[0] == "upstream" for path in files)
        assert f"fetched upstream/ ({upstream} files of AMD-AGI/Infera at 5890f7f) from {base}{ARCHIVE}" in first.stdout
        assert "not generated: upstream/runtime/sglang-0.5.17-options.json" in first.stdout
        pinned = len(fetch_shared.METACONTROLLER_SUMS.read_text().splitlines())
        assert (
            f"fetched metacontroller/source/ ({pinned} files of metacontroller/metacontroller v4.17.2, each as "
            f"SHA256SUMS pins it) from {base}{MC_ARCHIVE}"
        ) in first.stdout

        written = {path: path.stat().st_mtime_ns for path in into.rglob("*")}
        second = run(into, base)
        assert second.returncode == 0, second.stderr
        assert f"up to date: {into / 'schemas'}" in second.stdout
        assert f"up to date: {into / 'upstream'}" in second.stdout
        assert f"up to date: {into / 'metacontroller' / 'source'}" in second.stdout
        assert {path: path.stat().st_mtime_ns for path in into.rglob("*")} == written


def test_an_http_error_is_one_line_naming_the_url_and_installs_nothing(tmp_path: Path) -> None:
    routes = github(shared_files())
    del routes[ARCHIVE]
    into = tmp_path / "shared"
    with serving(routes) as base:
        result = run(into, base)
    line = one_error_line(result)
    assert f"{base}{ARCHIVE}" in line and "404" in line
    # The schemas were fetched before the failure, but nothing reached the folder, not even a staging leftover.
    assert "fetched schemas/lws.yaml" in result.stdout
    assert list(into.iterdir()) == []


def test_a_release_file_that_differs_from_its_pinned_digest_is_refused_and_installs_nothing(tmp_path: Path) -> None:
    files = shared_files()
    go_mod = fetch_shared.METACONTROLLER_SOURCE / "go.mod"
    files[go_mod] += b"replace k8s.io/api => example.com/api v0.0.1\n"
    into = tmp_path / "shared"
    with serving(github(files)) as base:
        line = one_error_line(run(into, base))
    assert f"{base}{MC_ARCHIVE}: go.mod has sha256 " in line and ", not the pinned " in line
    assert list(into.iterdir()) == []


def test_the_pins_are_every_file_of_the_shared_release_and_nothing_else() -> None:
    """SHA256SUMS is what ../shared's copy of the release holds, file for file: the build's
    source and what a clone without ../shared fetches are the same tree."""
    files = shared_files()
    source = fetch_shared.METACONTROLLER_SOURCE
    held = {path.relative_to(source).as_posix(): data for path, data in files.items() if path.is_relative_to(source)}
    lines = fetch_shared.METACONTROLLER_SUMS.read_text().splitlines()
    assert lines == [f"{hashlib.sha256(held[path]).hexdigest()}  {path}" for path in sorted(held)]


def test_an_archive_path_out_of_the_tree_is_refused(tmp_path: Path) -> None:
    # Deep enough to leave `into` from upstream/runtime/infera/ if it were written.
    escape = f"{TOP}/infera/{'../' * 6}escaped.py"
    into = tmp_path / "a" / "b" / "shared"
    with serving(github(shared_files(), {escape: b"outside\n"})) as base:
        line = one_error_line(run(into, base))
    assert f"unsafe path in the archive: {escape}" in line
    assert not list(tmp_path.rglob("escaped.py"))
    assert list(into.iterdir()) == []


def test_the_sglang_record_survives_a_round_trip_through_the_standin() -> None:
    """Describing the parser the stand-in builds from the record gives the record back, but for SGLang's
    custom flag actions (its deprecated flags): the stand-in makes them store_true, an argparse flag, which
    describe_parser records as taking no value."""
    need_runtime()
    server_args = runtime_loader.load("sglang.srt.server_args")
    parser = argparse.ArgumentParser(add_help=False)
    server_args.ServerArgs.add_cli_args(parser)
    record = json.loads((RUNTIME / Path(fetch_shared.SGLANG_OPTIONS).name).read_text())
    described = fetch_shared.describe_parser(parser)
    custom_flags = [action for action in record["actions"] if action.get("nargs") == 0 and action["takes_value"]]
    assert custom_flags, "the record has no custom flag action left: drop the exception below"
    assert described == [
        action | {"takes_value": False} if action in custom_flags else action for action in record["actions"]
    ]

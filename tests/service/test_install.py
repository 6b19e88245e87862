"""The install, as a newcomer and the image do it: from a fresh copy of the checkout, into a new
virtual environment holding `.` alone (no extras), from PyPI or pip's cache. This is how a
serve path that imported a module only the test extra brought would be caught."""

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.checkout import copy_checkout
from tests.support.docs import readme_curl, setup_commands
from tests.support.prerequisites import REPO, need

README_PORT = 8080  # the README's serve command binds 127.0.0.1:8080, and its curl call asks there
INSTALL_SECONDS = 600


def clean_environment() -> dict[str, str]:
    """This machine's environment without this test run's virtual environment on PATH: the
    README's `python3` is the machine's."""
    ours = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != ours)
    dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PROMETHEUS_MULTIPROC_DIR")
    return {k: v for k, v in os.environ.items() if k not in dropped} | {"PATH": path}


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: TIME_WAIT is no obstacle
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@contextmanager
def running(command: list[str], cwd: Path, ready_url: str, log: Path) -> Iterator[subprocess.Popen]:
    """`command` in its own process group, until `ready_url` answers 200; then Ctrl-C, as a user
    stops it, and the group is gone."""
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=cwd, env=clean_environment(), stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + INSTALL_SECONDS
        while True:
            assert process.poll() is None, f"exited with {process.returncode}:\n{log.read_text()[-4000:]}"
            try:
                if get(ready_url)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not ready after {INSTALL_SECONDS} s:\n{log.read_text()[-4000:]}"
            time.sleep(0.5)
        yield process
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=30) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_the_readme_serve_command_serves_from_a_fresh_clone(tmp_path: Path) -> None:
    need(port_is_free(README_PORT), f"port {README_PORT}, which the README's serve command binds, is in use")
    clone = copy_checkout(tmp_path / "clone")
    serve, _ = setup_commands()
    with running(["bash", "-c", serve], clone, f"http://127.0.0.1:{README_PORT}/readyz", tmp_path / "serve.log"):
        assert get(f"http://127.0.0.1:{README_PORT}/readyz") == (200, b'{"status":"ready"}')
        answer = json.loads(
            subprocess.run(shlex.split(readme_curl()), cwd=clone, capture_output=True, check=True, timeout=30).stdout
        )
        assert (len(answer["children"]), answer["status"]["state"]) == (15, "initializing")
        installed = subprocess.run(
            [str(clone / ".venv" / "bin" / "pip"), "list", "--format=json"], capture_output=True, check=True
        )
        names = {package["name"].lower() for package in json.loads(installed.stdout)}
        assert "infera-hooks" in names and "pytest" not in names  # `.` alone, no test extra


def dockerfile_instructions() -> list[tuple[str, str]]:
    lines = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text()).splitlines()
    return [tuple(line.split(None, 1)) for line in lines if line.strip() and not line.startswith("#")]  # type: ignore[misc]


def test_the_build_context_is_what_the_dockerfile_copies() -> None:
    """.dockerignore admits exactly the files the Dockerfile copies: no .venv or .git in the
    context, and nothing copied that the context would lack."""
    copied = {
        source.rstrip("/")
        for instruction, arguments in dockerfile_instructions()
        if instruction == "COPY"
        for source in arguments.split()[:-1]
    }
    patterns = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]
    assert patterns[0] == "*"
    assert {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")} == copied
    assert all((REPO / source).exists() for source in copied)


def test_the_image_installs_and_serves_from_its_build_context(tmp_path: Path) -> None:
    """The image's install on this machine: the files the Dockerfile copies, installed as its
    RUN line does, started as its ENTRYPOINT and CMD (on a loopback port)."""
    instructions = dockerfile_instructions()
    context = tmp_path / "src"
    clone = copy_checkout(tmp_path / "clone")
    for instruction, arguments in instructions:
        if instruction == "COPY":
            *sources, _ = arguments.split()
            for source in sources:
                (context / source).parent.mkdir(parents=True, exist_ok=True)
                (clone / source).rename(context / source)
    (run,) = [arguments for instruction, arguments in instructions if instruction == "RUN"]
    install = run.split("&&")[0].strip()
    assert install == "pip install --no-cache-dir ."
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), *shlex.split(install)[1:]],
        cwd=context,
        env=clean_environment(),
        capture_output=True,
        check=True,
        timeout=INSTALL_SECONDS,
    )
    (entrypoint,) = [json.loads(a) for i, a in instructions if i == "ENTRYPOINT"]
    (cmd,) = [json.loads(a) for i, a in instructions if i == "CMD"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [str(venv / "bin" / entrypoint[0]), *entrypoint[1:], *cmd]
    argv[argv.index("0.0.0.0:8080")] = f"127.0.0.1:{port}"
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    with running(argv, workdir, f"http://127.0.0.1:{port}/readyz", tmp_path / "image.log"):
        assert get(f"http://127.0.0.1:{port}/healthz") == (200, b'{"status":"ok"}')
    version = subprocess.run([argv[0], "--version"], capture_output=True, text=True, check=True)
    assert version.stdout == "infera-hooks 0.1.0\n"


def test_the_image_is_pinned_and_runs_as_a_numeric_non_root_user() -> None:
    instructions = dict(dockerfile_instructions())
    # One Python patch release on one Debian release (a digest may follow): a rebuild gets the
    # interpreter the tests ran on, not whatever `3.11-slim` names that day.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", instructions["FROM"])
    user, group = instructions["USER"].split(":")
    assert int(user) > 0 and int(group) > 0  # numeric: runAsNonRoot can check it


def test_the_licence_is_the_one_pyproject_declares() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    assert (REPO / "LICENSE").read_text().startswith("MIT License\n")

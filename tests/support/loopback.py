"""Programs the tests start on loopback: a port for each, waiting until it is ready, and a
certificate for those the API server calls."""

import base64
import socket
import subprocess
import time
from pathlib import Path

import httpx


def free_port() -> int:
    """A loopback port nothing listens on now (the kernel's choice; free until someone binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_ready(process: subprocess.Popen, url: str, log: Path, seconds: float = 60) -> None:
    """Until `url` answers 200, failing with the end of the program's `log` if it exits or
    takes longer than `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, log.read_text()[-4000:]
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"not ready within {seconds:.0f} s: {log.read_text()[-4000:]}"
        time.sleep(0.5)


def loopback_certificate(directory: Path) -> str:
    """A self-signed serving certificate for 127.0.0.1 in `directory` (tls.crt, tls.key), as a
    webhook server reads it; its caBundle, for the webhook configurations that call it (no
    Service can reach a process outside the cluster's pod network, so they call it by URL)."""
    directory.mkdir(exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(directory / "tls.key"),
         "-out", str(directory / "tls.crt")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return base64.b64encode((directory / "tls.crt").read_bytes()).decode()

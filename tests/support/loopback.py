"""Programs the tests start on loopback: a port for each, waiting until it is ready, and a
certificate for those the API server calls."""

import base64
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

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


def controller_configuration(kind: str, certs: Path, webhook_port: int, health_port: int) -> dict[str, Any]:
    """The configuration file of a controller-runtime controller (`kind`: its apiVersion) run
    as a loopback process: no leader election, its webhooks served on 127.0.0.1 with the
    loopback certificate in `certs` (no certificates of its own), no metrics server, and its
    health checks on `health_port`."""
    return {
        "apiVersion": kind,
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }

"""Programs the tests start on loopback: a port for each, and waiting until it is ready."""

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

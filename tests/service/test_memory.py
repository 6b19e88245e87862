"""The hook pod's memory stays within the bundle's limit in the worst case its bounds allow:
both workers with their render memo full, each with the largest request in
flight. Measured as the proportional set size (PSS) of the master and its workers, which is
what the processes take of the pod's memory (shared pages split between them), with the
in-memory /tmp volume counted full."""

import copy
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from hooks.contract import DEFAULT_MAX_REQUEST_BYTES
from hooks.quantity import quantity_value
from tests.support.graphs import graph
from tests.support.prerequisites import REPO, need
from tests.support.requests import request_body
from tests.support.service import HookClient, RunningServer, running_server

# What the limit must keep free beyond the worst case measured here: another allocator's or
# kernel's accounting, a build whose objects are somewhat larger.
MARGIN = 0.15


def hook_container() -> dict[str, Any]:
    documents = yaml.safe_load_all((REPO / "metacontroller" / "hooks.yaml").read_text())
    (deployment,) = [doc for doc in documents if doc and doc["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (tmp,) = deployment["spec"]["template"]["spec"]["volumes"]
    return {**container, "tmpSizeLimit": tmp["emptyDir"]["sizeLimit"]}


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:  # a worker that died: its replacement is not counted, and the test fails below
            continue
        (line,) = [line for line in rollup.splitlines() if line.startswith("Pss:")]
        total += int(line.split()[1]) * 1024
    return total


def env_heavy_body(index: int) -> bytes:
    """A distinct parent with 6,000 environment variables: its parsed spec and its children
    take megabytes of a worker's memo."""
    envs = [{"name": f"VAR_{j:05d}", "value": f"value-{j}"} for j in range(6000)]
    obj = graph(f"env-heavy-{index}").envs(*envs).obj()
    return json.dumps(request_body(obj)).encode()


def largest_request() -> bytes:
    """A sync of an env-heavy parent with observed Deployments filling the body up to the size
    the hook accepts: Kubernetes objects, which decode to several times their JSON (strings
    would decode to about their size)."""
    body = json.loads(env_heavy_body(-1))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "", "namespace": "default", "uid": "u", "resourceVersion": "1", "generation": 1},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "x"}},
            "template": {
                "metadata": {"labels": {"app": "x", "tier": "worker"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "rocm/infera:sglang-v0.1.1",
                            "args": ["--port", "30000", "--model-path", "/models"],
                            "env": [{"name": f"E{j}", "value": str(j)} for j in range(20)],
                            "ports": [{"containerPort": 30000, "protocol": "TCP"}],
                            "resources": {"limits": {"amd.com/gpu": "1"}, "requests": {"cpu": "4", "memory": "16Gi"}},
                        }
                    ]
                },
            },
        },
        "status": {"replicas": 1, "readyReplicas": 1, "observedGeneration": 1},
    }
    compact = {"separators": (",", ":")}
    observed = body["children"]["Deployment.apps/v1"]
    # Each observed child adds `"observed-000000":{...},`, with its name in its metadata too.
    room = DEFAULT_MAX_REQUEST_BYTES - len(json.dumps(body, **compact))
    unit = len(json.dumps(deployment, **compact)) + len('"observed-000000":,') + len("observed-000000")
    for index in range(room // unit):
        child = copy.deepcopy(deployment)
        child["metadata"]["name"] = name = f"observed-{index:06d}"
        observed[name] = child
    data = json.dumps(body, **compact).encode()
    assert DEFAULT_MAX_REQUEST_BYTES - unit < len(data) <= DEFAULT_MAX_REQUEST_BYTES
    return data


def peak_while(server: RunningServer, action: Any) -> int:
    """The most PSS the service had while `action` ran."""
    pids = [server.process.pid, *server.workers()]
    peak, done = [pss_bytes(pids)], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], pss_bytes(pids))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        action()
    finally:
        done.set()
        sampler.join()
    return max(peak[0], pss_bytes(pids))


def test_the_worst_case_stays_under_the_bundle_memory_limit_with_a_margin(tmp_path: Path) -> None:
    need(Path("/proc/self/smaps_rollup").exists(), "/proc/<pid>/smaps_rollup (Linux 4.14 or later) gives PSS")
    container = hook_container()
    limit = int(quantity_value(container["resources"]["limits"]["memory"]))
    tmp_volume = int(quantity_value(container["tmpSizeLimit"]))
    assert container["args"][-2:] == ["--workers", "2"]
    bodies = [env_heavy_body(index) for index in range(40)]
    largest = largest_request()
    with running_server(tmp_path, workers=2) as server:
        client = HookClient(server.url)
        workers = server.workers()

        def fill() -> None:
            # Four clients, three rounds: every worker's memo full (each sees about twenty of these
            # parents).
            with ThreadPoolExecutor(4) as pool:
                for _ in range(3):
                    assert set(pool.map(lambda body: client.request("POST", "/sync", body).status, bodies)) == {200}

        def largest_in_flight() -> None:
            # A worker reads one maximum-size body at a time and turns another away (503, and the
            # connection reset under the rest of the body): three clients keep both busy.
            def send(_: int) -> list[int | str]:
                statuses: list[int | str] = []
                for _ in range(3):
                    try:
                        statuses.append(client.request("POST", "/sync", largest).status)
                    except OSError:
                        statuses.append("reset")
                return statuses

            with ThreadPoolExecutor(3) as pool:
                statuses = [status for each in pool.map(send, range(3)) for status in each]
            assert statuses.count(200) >= 2 and set(statuses) <= {200, 503, "reset"}, statuses

        filled = peak_while(server, fill)
        peak = max(filled, peak_while(server, largest_in_flight))
        assert server.workers() == workers, "a worker died"
    budget = (1 - MARGIN) * limit
    assert peak + tmp_volume <= budget, (
        f"{peak / 2**20:.0f} MiB at most, and {tmp_volume / 2**20:.0f} MiB of /tmp, with the memo "
        f"full ({filled / 2**20:.0f} MiB): over {1 - MARGIN:.0%} of the {limit / 2**20:.0f} MiB limit"
    )

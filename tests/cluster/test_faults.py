"""Faults on the real control plane, as a person makes and sees them with kubectl: a child the
API server refuses to create again after `kubectl delete` (a ResourceQuota), a broker pod no
node takes, and a BlueGreen front door deleted or edited mid-rollout. What the graph says is
read from `kubectl get idep` and a watch of its versions; who wrote what, from the audit log.
"""

import http.server
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from hooks.vocabulary import GENERATION_LABEL
from tests.cluster.test_blue_green import (
    FRONT_DOOR,
    NAME,
    NEW_IMAGE,
    audited,
    cordoned,
    deployments_of,
    front_door,
    patch_image,
    stable_graph,
    stalled,
    watched,
    writes_to,
)
from tests.cluster.test_graphs import (
    children,
    columns,
    eventually,
    get,
    metacontroller_writes,
    quiet,
    set_hook_urls,
)
from tests.support.cluster import Cluster
from tests.support.graphs import graph
from tests.support.localcluster import Installed
from tests.support.metacontroller import USER as METACONTROLLER_USER
from tests.support.requests import controller

PD_NAME = "qwen-faults"
# The hooks' timeout the bundle's CompositeController gives Metacontroller ("10s").
HOOK_TIMEOUT_SECONDS = int(controller()["spec"]["hooks"]["sync"]["webhook"]["timeout"].removesuffix("s"))


def ready_pd_graph(installed: Installed, namespace: str) -> dict[str, Any]:
    """examples/pd-disaggregated.yaml as `PD_NAME`, Ready on kwok nodes."""
    cluster = installed.cluster
    idep = graph(PD_NAME).metadata(namespace=namespace).manifest()
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(idep))
    wait_for(cluster, namespace, "Ready", 180)
    return get(cluster, "-n", namespace, "idep", PD_NAME)


def conditions(idep: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in idep["status"]["conditions"]}


def kubectl(cluster: Cluster, *arguments: str, stdin: str | None = None) -> None:
    done = cluster.kubectl(*arguments, stdin=stdin)
    assert done.returncode == 0, done.stderr


def wait_for(cluster: Cluster, namespace: str, condition: str, seconds: int = 120) -> None:
    """`kubectl wait --for=condition=...` on the PD graph."""
    waited = cluster.kubectl(
        "wait", "-n", namespace, f"--for=condition={condition}", f"idep/{PD_NAME}", f"--timeout={seconds}s",
        timeout=seconds + 10,
    )  # fmt: skip
    assert waited.returncode == 0, waited.stderr


@pytest.mark.parametrize("namespace", ["faults-quota"], indirect=True)
def test_a_child_the_api_server_will_not_create_again_holds_readiness_and_is_named(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    ready_pd_graph(installed, namespace)
    service = f"{PD_NAME}-server"
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-more-services", "namespace": namespace},
        "spec": {"hard": {"services": "0"}},
    }
    kubectl(cluster, "apply", "-f", "-", stdin=json.dumps(quota))
    since = len(cluster.audit_writes_to(namespace, "services", service))
    with installed.metacontroller.erring():
        kubectl(cluster, "delete", "-n", namespace, "service", service)

        said = f"not created yet: Service {service} (if it stays missing, another object holds the name"
        pending = eventually(
            lambda: (idep := get(cluster, "-n", namespace, "idep", PD_NAME))["status"]["state"] == "pending" and idep,
            "the graph to say it is pending",
        )
        assert said in pending["status"]["message"]
        assert conditions(pending)["Ready"][:2] == ("False", "ChildrenMissing")
        assert conditions(pending)["ChildrenCreated"][:2] == ("False", "ChildrenMissing")
        shown = columns(cluster, namespace, PD_NAME, "wide")
        assert shown["STATE"] == "pending" and shown["MESSAGE"].startswith(said)
        wait_for(cluster, namespace, "ChildrenCreated=False", 10)
        # Metacontroller's create was refused by the quota, every time it tried.
        tried = [e for e in cluster.audit_writes_to(namespace, "services", service)[since:] if e["verb"] == "create"]
        assert tried and all(e["user"]["username"] == METACONTROLLER_USER for e in tried), tried
        assert all(
            e["responseStatus"]["code"] == 403 and "exceeded quota" in e["responseStatus"]["message"] for e in tried
        )

        kubectl(cluster, "delete", "-n", namespace, "resourcequota", "no-more-services")
        wait_for(cluster, namespace, "Ready")
    assert conditions(get(cluster, "-n", namespace, "idep", PD_NAME))["ChildrenCreated"][:2] == ("True", "AllCreated")


@pytest.mark.parametrize("namespace", ["faults-broker"], indirect=True)
def test_a_broker_pod_no_node_takes_holds_readiness_in_the_schedulers_words(
    installed: Installed, namespace: str
) -> None:
    cluster = installed.cluster
    ready_pd_graph(installed, namespace)
    with cordoned(cluster):
        kubectl(cluster, "delete", "-n", namespace, "pod", f"{PD_NAME}-nats-0", "--wait=false")
        pending = eventually(
            lambda: (
                "unschedulable" in ((idep := get(cluster, "-n", namespace, "idep", PD_NAME))["status"]["message"])
                and idep
            ),
            "the graph to say why its broker waits",
        )
        message = pending["status"]["message"]
        assert pending["status"]["state"] == "pending"
        assert message.startswith("NATS broker 0/1 ready; nats: 1 pod unschedulable: 0/"), message
        assert "node(s) were unschedulable" in message
        assert conditions(pending)["Ready"][:2] == ("False", "BrokerNotReady")
    wait_for(cluster, namespace, "Ready")


@contextmanager
def hooks_that_fail(how: str) -> Iterator[tuple[str, list[str]]]:
    """A loopback server in the hooks' place that answers every call with a 500 (`how` "500")
    or not within Metacontroller's hook timeout ("slow"): its URL, and the paths it was called at."""
    calls: list[str] = []

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            calls.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if how == "slow":
                time.sleep(HOOK_TIMEOUT_SECONDS + 2)
            body = b'{"error": "failing on purpose"}'
            self.send_response(500)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", calls
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("namespace", ["faults-hook-errors"], indirect=True)
@pytest.mark.parametrize("how", ["500", "slow"])
def test_hooks_that_answer_500_or_too_late_keep_every_child_and_are_called_again(
    installed: Installed, namespace: str, how: str
) -> None:
    """Metacontroller's own handling of a failing hook: it writes nothing to the graph or its
    children, says why in a Warning event on the graph, and calls again; once the hooks answer,
    the graph is Ready with the children it had."""
    cluster, metacontroller = installed.cluster, installed.metacontroller
    ready_pd_graph(installed, namespace)
    # Ready is one sync's answer; the baseline is the graph once its syncs write nothing more.
    eventually(lambda: quiet(installed, namespace), "the graph's syncs to write nothing", 180)
    parent = get(cluster, "-n", namespace, "idep", PD_NAME)
    before = versions(cluster, namespace, parent["metadata"]["uid"])
    since = len(cluster.audit_writes(METACONTROLLER_USER))
    with metacontroller.erring(), hooks_that_fail(how) as (url, calls):
        set_hook_urls(cluster, url)
        try:
            eventually(lambda: len(calls) >= 3, "three calls of the failing hooks", 120)
            said = "unsupported status code: 500" if how == "500" else "Client.Timeout exceeded"
            eventually(
                lambda: any(
                    e["type"] == "Warning" and said in e["message"]
                    for e in get(
                        cluster,
                        "-n",
                        namespace,
                        "events",
                        "--field-selector",
                        f"involvedObject.name={PD_NAME},reason=SyncError",
                    )["items"]
                ),
                f"a SyncError event saying {said!r}",
            )
            assert metacontroller_writes(cluster, namespace, since) == []
        finally:
            answered = len(installed.hooks.calls("sync"))
            set_hook_urls(cluster, installed.hooks_url)
            eventually(lambda: len(installed.hooks.calls("sync")) > answered, "a sync the hooks answer")
    wait_for(cluster, namespace, "Ready")
    assert versions(cluster, namespace, parent["metadata"]["uid"]) == before
    assert get(cluster, "-n", namespace, "idep", PD_NAME)["status"] == parent["status"]


def versions(cluster: Cluster, namespace: str, uid: str) -> dict[tuple[str, str], str]:
    """Each child of the graph, by kind and name, with its resourceVersion."""
    return {
        (c["kind"], c["metadata"]["name"]): c["metadata"]["resourceVersion"] for c in children(cluster, namespace, uid)
    }


def untouched(cluster: Cluster, namespace: str, generation: str) -> dict[str, tuple[str, str]]:
    return {
        d["metadata"]["name"]: (d["metadata"]["uid"], d["metadata"]["resourceVersion"])
        for d in get(cluster, "-n", namespace, "deployments")["items"]
        if d["metadata"]["name"] in deployments_of(generation)
    }


@pytest.fixture
def stalled_rollout(installed: Installed, namespace: str) -> Iterator[tuple[dict[str, Any], str, str]]:
    """A BlueGreen graph mid-rollout whose new generation no node takes: (the graph, the serving
    generation, the incoming one)."""
    cluster = installed.cluster
    parent = stable_graph(installed, namespace)
    old = parent["status"]["rollout"]["servingGeneration"]
    with cordoned(cluster):
        patch_image(cluster, namespace, NEW_IMAGE)
        rolling = stalled(cluster, namespace)
        new = rolling["status"]["rollout"]["incomingGeneration"]
        assert rolling["status"]["state"] == "ready"
        yield rolling, old, new


@pytest.mark.parametrize(
    ("namespace", "fault"),
    [("faults-door-deleted", "delete"), ("faults-door-edited", "edit")],
    indirect=["namespace"],
)
def test_a_front_door_deleted_or_edited_mid_rollout_comes_back_to_the_serving_generation(
    installed: Installed, namespace: str, fault: str, stalled_rollout: tuple[dict[str, Any], str, str]
) -> None:
    cluster = installed.cluster
    rolling, old, new = stalled_rollout
    serving = untouched(cluster, namespace, old)
    assert set(serving) == deployments_of(old)
    since = len(audited(cluster, namespace))
    with watched(cluster, namespace, rolling["metadata"]["resourceVersion"]) as seen:
        if fault == "delete":
            kubectl(cluster, "delete", "-n", namespace, "service", FRONT_DOOR)
        else:
            selector = json.dumps({"spec": {"selector": {GENERATION_LABEL: new}}})
            kubectl(cluster, "patch", "-n", namespace, "service", FRONT_DOOR, "--type=merge", "-p", selector)
        eventually(
            lambda: (
                (door := cluster.kubectl("get", "-n", namespace, "service", FRONT_DOOR, "-o", "json")).returncode == 0
                and json.loads(door.stdout)["spec"]["selector"].get(GENERATION_LABEL) == old
            ),
            "the front door back on the serving generation",
        )
        back = eventually(
            lambda: (
                (idep := get(cluster, "-n", namespace, "idep", NAME))["status"]["state"] == "ready"
                and "restored" not in idep["status"]["rollout"]["message"]
                and idep
            ),
            "the graph ready again",
        )
        # A recreated front door need not change the status at all, so the graph as it was
        # when the fault began counts as a version the watch has seen.
        eventually(
            lambda: any(
                i["metadata"]["resourceVersion"] == back["metadata"]["resourceVersion"] for i in [rolling, *seen]
            ),
            "the watch to catch up",
            30,
        )
    # Every status written meanwhile: the serving generation served throughout.
    assert {
        (i["status"]["rollout"]["servingGeneration"], i["status"]["rollout"].get("incomingGeneration"))
        for i in [rolling, *seen]
    } == {(old, new)}
    # Nobody wrote to the serving generation's Deployments: they are the objects they were.
    assert writes_to(audited(cluster, namespace)[since:], "deployments", deployments_of(old)) == []
    assert untouched(cluster, namespace, old) == serving
    assert front_door(cluster, namespace)["spec"]["selector"][GENERATION_LABEL] == old
    assert columns(cluster, namespace, NAME, "wide")["SERVING"] == old

"""The end-to-end scenarios: run in the sandbox (tests/support/e2e/sandbox.py) against a rendered graph,
each asserting what a user of the graph would check. A failed assertion fails the test, which
then prints every process's last log lines."""

import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from tests.support.e2e.graphs import MODEL, PAGE_SIZE
from tests.support.e2e.sandbox import Cluster, Pod, wait_until

# Long enough to fill many 4-token pages, so a repeat is a prefix-cache hit.
PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)
WORKER_INFO = "infera.amd.com/worker-info"


# A GET is asked again after this long without an answer, until its timeout. Just after a pod's
# network is torn down, a new connection in the sandbox now and then gets no reply although the
# server logs its answer, while the next is served at once (seen: nothing in 5 s, then a reply in
# under 10 ms): the sandbox's network, not what a test is about.
GET_ATTEMPT_SECONDS = 5.0


def request(
    url: str, body: dict[str, Any] | None = None, timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    # Only a GET, which changes nothing, is asked again.
    attempt = min(timeout, GET_ATTEMPT_SECONDS) if data is None else timeout
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(req, timeout=min(attempt, max(deadline - time.monotonic(), 0.1))) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (TimeoutError, urllib.error.URLError) as error:
            timed_out = isinstance(error, TimeoutError) or isinstance(error.reason, TimeoutError)
            if not timed_out or data is not None or time.monotonic() >= deadline:
                raise


def chat(cluster: Cluster, prompt: str = PROMPT, url: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chat completion through the server's Service (or `url`), answered 200."""
    status, body = request(
        f"{url or cluster.url('server')}/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": prompt}], **extra},
    )
    assert status == 200, (status, body)
    return body


def stream_chat(
    cluster: Cluster, prompt: str = PROMPT, timeout: float = 60, url: str | None = None, **extra: Any
) -> tuple[list[str], bool]:
    """The content deltas of a streamed chat completion through the server's Service (or
    `url`), and whether it ended with [DONE]."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True, **extra}
    req = urllib.request.Request(
        f"{url or cluster.url('server')}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    deltas, done = [], False
    with urllib.request.urlopen(req, timeout=timeout) as reply:
        assert reply.status == 200
        for line in reply:
            line = line.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
                deltas.append(choices[0].get("delta", {}).get("content") or "")
    return deltas, done


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus metric over its label sets."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def engine_requests(pod: Pod) -> list[dict[str, Any]]:
    """What the stand-in engine of a worker pod served."""
    status, served = request(f"http://{pod.ip}:{worker_port(pod)}/standin/requests")
    assert status == 200, served
    return served


def worker_port(pod: Pod) -> int:
    return pod.pod.spec["containers"][0]["ports"][0]["containerPort"]


def registered(cluster: Cluster, router: str | None = None) -> list[dict[str, Any]]:
    """The router's worker list (a ValueError, retried by wait_until, while it does not answer)."""
    status, body = request(f"{router or cluster.url('server')}/v1/workers")
    if status != 200:
        raise ValueError(f"/v1/workers answered {status}: {body}")
    return body["workers"]


def rules_of(cluster: Cluster, account: str) -> list[dict[str, Any]]:
    """The rules the rendered RoleBindings grant `account` in the graph's namespace."""
    subject = {"kind": "ServiceAccount", "name": account, "namespace": cluster.namespace}
    return [
        rule
        for child in cluster.children
        if child["kind"] == "RoleBinding" and subject in child["subjects"]
        for rule in cluster.by_key[("Role", child["roleRef"]["name"])]["rules"]
    ]


def assert_calls_allowed(cluster: Cluster) -> None:
    """Every call the graph's processes made to the API server is one that the rendered Role of
    the caller's own account grants: the call's address is its pod's IP (the sandbox's own
    changes to pods do not go through HTTP)."""
    assert cluster.kube.events, "no process called the API server"
    by_ip = {pod.ip: pod for pod in cluster.pods.values()}
    for call in cluster.kube.events:
        pod = by_ip[call.client]
        rules = rules_of(cluster, pod.pod.spec.get("serviceAccountName", "default"))
        parts = call.path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        resource, name = (parts[parts.index("namespaces") + 2 :] + [None])[:2]
        verb = {"PATCH": "patch"}.get(call.method) or (
            "watch" if call.query.get("watch") else "get" if name else "list"
        )
        assert any(
            group in rule["apiGroups"]
            and resource in rule["resources"]
            and verb in rule["verbs"]
            and (not rule.get("resourceNames") or name in rule["resourceNames"])
            for rule in rules
        ), (pod.name, call)


def start(cluster: Cluster) -> None:
    cluster.start()
    cluster.wait_ready(timeout=60)
    assert_run_as_rendered(cluster)


# The containers the hook renders restricted (a server's `infera` by its pod's component).
RESTRICTED_CONTAINERS = {"nats", "epp", "infera-frontend"}
RESTRICTED_UID = 65532


def assert_run_as_rendered(cluster: Cluster) -> None:
    """The routers and the broker run as uid 65532 on a read-only root and can write only to
    their writable volumes; an engine runs as its image's root on a writable one."""
    for pod in cluster.pods.values():
        for container in pod.containers:
            restricted = container.name in RESTRICTED_CONTAINERS or (
                container.name == "infera" and pod.labels.get("infera.amd.com/component") == "server"
            )
            inside = container.enter()
            uid = subprocess.run([*inside, "id", "-u"], capture_output=True, text=True, check=True).stdout
            written = subprocess.run([*inside, "touch", "/.infera-write-test"], capture_output=True, text=True)
            assert (int(uid), "Read-only file system" in written.stderr) == (
                (RESTRICTED_UID, True) if restricted else (0, False)
            ), (pod.name, container.name, uid, written.stderr)
            for _, target, read_only in container.setup["mounts"]:
                if not read_only:
                    probe = f"{target}/.infera-write-test"
                    subprocess.run([*inside, "sh", "-c", f"touch {probe} && rm {probe}"], check=True)


def assert_registered(cluster: Cluster, *services: str) -> None:
    """Every worker service's pod registered, at its Pod IP, active."""
    expected = sorted(f"http://{cluster.pod_of(s).ip}:{worker_port(cluster.pod_of(s))}" for s in services)
    wait_until(
        f"workers {', '.join(services)} registered",
        lambda: sorted(w["url"] for w in registered(cluster) if w["status"] == "active") == expected,
        30,
    )


def assert_prefix_cache_hit(cluster: Cluster, worker: Pod) -> None:
    """The router learns a worker's cache from its KV events: once the events of a prompt's pages
    have reached it, the prompt again is routed with every one of those pages as a hit."""
    router = cluster.url("server")
    view_before = metric(router, "infera_policy_cache_view_size")
    chat(cluster)
    record = engine_requests(worker)[-1]
    pages = record["prompt_tokens"] // PAGE_SIZE
    assert pages >= 8, record  # a prompt long enough to mean something
    wait_until(
        f"the events of the prompt's {pages} pages to reach the router's cache view",
        lambda: metric(router, "infera_policy_cache_view_size") >= view_before + pages,
        20,
    )
    hits_before = metric(router, "infera_router_pick_cache_hits_sum")
    chat(cluster)
    hits = metric(router, "infera_router_pick_cache_hits_sum") - hits_before
    assert hits >= pages, (hits, pages)
    print(f"a repeated prompt of {pages} pages was routed with {hits:.0f} cached blocks")


def nats_greeting(nats: Pod, token: str | None) -> str:
    """What the broker answers a client that connects (with `token`, if any) and pings: PONG,
    or the error it closes the connection with (the NATS protocol's own words)."""
    with socket.create_connection((nats.ip, 4222), timeout=10) as connection:
        replies = connection.makefile("rb")
        assert replies.readline().startswith(b"INFO "), "the broker did not greet"
        options = {"verbose": False, "pedantic": False, "protocol": 1, **({"auth_token": token} if token else {})}
        connection.sendall(f"CONNECT {json.dumps(options)}\r\nPING\r\n".encode())
        return replies.readline().decode().strip()


# --- the scenarios --------------------------------------------------------------------------


def serves_and_routes_by_prefix(cluster: Cluster) -> None:
    """A mixed worker behind the router: it registers where it is, answers unary and streamed
    chat completions through the router, and the router routes a repeated prompt as a
    prefix-cache hit from the KV events it received (over NATS when the broker is deployed)."""
    start(cluster)
    assert_registered(cluster, "worker")
    worker = cluster.pod_of("worker")
    if cluster.kube is not None:  # Kubernetes discovery: the worker's record is its Pod's annotation
        record = json.loads(cluster.kube.pod(cluster.namespace, worker.name)["metadata"]["annotations"][WORKER_INFO])
        assert record["url"] == f"http://{worker.ip}:{worker_port(worker)}"
    reply = chat(cluster, "hello world", max_tokens=6)
    text = reply["choices"][0]["message"]["content"]
    assert f"pod={worker.name}" in text, text
    deltas, done = stream_chat(cluster, "hello world", max_tokens=6)
    assert done and "".join(deltas) == text
    if cluster.spec.get("nats", {}).get("deploy", True):
        # Over NATS: the worker wrapper takes the request from its subject and calls its engine locally.
        assert {r["client"] for r in engine_requests(worker)} == {"127.0.0.1"}, engine_requests(worker)
    assert_prefix_cache_hit(cluster, worker)
    if cluster.kube is not None:
        assert_calls_allowed(cluster)
    nats = cluster.pod_of("nats")
    token = cluster.spec["nats"].get("tokenSecretRef") if "nats" in cluster.spec else None
    if token is not None:
        secret = cluster.secrets[token["name"]][token["key"]]
        assert nats_greeting(nats, None) == "-ERR 'Authorization Violation'"
        assert nats_greeting(nats, "not-" + secret) == "-ERR 'Authorization Violation'"
        assert nats_greeting(nats, secret) == "PONG"
    status, streams = request(f"http://{nats.ip}:8222/jsz?streams=true")
    assert status == 200
    kv_stream = [
        s for account in streams["account_details"] for s in account["stream_detail"] if s["name"] == "INFERA_KV_EVENTS"
    ]
    assert kv_stream and kv_stream[0]["state"]["messages"] > 0, streams
    print(
        "JetStream messages:",
        {s["name"]: s["state"]["messages"] for account in streams["account_details"] for s in account["stream_detail"]},
    )


def disaggregates(cluster: Cluster) -> None:
    """Prefill, decode and mixed pools: a request goes to a prefill and a decode worker with one
    bootstrap room, and the answer is the decode worker's."""
    start(cluster)
    assert_registered(cluster, "prefill", "decode", "mixed")
    text = chat(cluster, "hello world", max_tokens=5)["choices"][0]["message"]["content"]
    prefill, decode, mixed = (engine_requests(cluster.pod_of(s)) for s in ("prefill", "decode", "mixed"))
    assert mixed == [], "with a prefill and a decode pool, the router disaggregates"
    assert len(prefill) == len(decode) == 1, (prefill, decode)
    room = prefill[0]["bootstrap_room"]
    assert room is not None and decode[0]["bootstrap_room"] == room
    assert decode[0]["bootstrap_host"] == cluster.pod_of("prefill").ip
    assert f"[decode pod={cluster.pod_of('decode').name}" in text and f"room={room}" in text, text
    assert all(r["outcome"] == "ok" for r in prefill + decode)


def serves_over_http_and_zmq(cluster: Cluster) -> None:
    """Without the managed NATS: nothing waits for a broker, requests reach the engine over HTTP
    and the router subscribes to the worker's ZMQ KV events."""
    start(cluster)
    assert not [pod for pod in cluster.pods.values() if pod.labels.get("infera.amd.com/service") == "nats"]
    assert_registered(cluster, "worker")
    worker = cluster.pod_of("worker")
    kv_endpoint = registered(cluster)[0]["kv_events_endpoint"]
    assert kv_endpoint.startswith(f"tcp://{worker.ip}:"), kv_endpoint
    deltas, done = stream_chat(cluster, "hello world", max_tokens=4)
    assert done and len(deltas) >= 4
    # Over HTTP: the router itself calls the engine.
    assert {r["client"] for r in engine_requests(worker)} == {cluster.pod_of("server").ip}, engine_requests(worker)
    # No broker exists: the prefix-cache hits can only come from the worker's ZMQ events.
    assert_prefix_cache_hit(cluster, worker)


def drains_on_scale_down(cluster: Cluster) -> None:
    """A worker pod stopped as kubelet stops it, with a long generation in flight: the router stops
    sending it work at once, the generation completes, the worker deregisters and exits well
    within its grace period."""
    start(cluster)
    assert_registered(cluster, "worker")
    worker = cluster.pod_of("worker")
    tokens = 200  # at STANDIN_TOKEN_DELAY=0.1 s, longer than the 15 s preStop delay
    outcome: dict[str, Any] = {}

    def generate() -> None:
        try:
            outcome["deltas"], outcome["done"] = stream_chat(
                cluster, "hello world", timeout=120, max_tokens=tokens, ignore_eos=True
            )
        except Exception as error:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = error

    stream = threading.Thread(target=generate)
    stream.start()
    wait_until("the generation to start", lambda: any(r["outcome"] == "running" for r in engine_requests(worker)), 20)
    stopping = threading.Thread(target=cluster.stop_pod, args=(worker,))
    stopping.start()
    # The router drops the pod from routing on its deletion, long before the process is signalled.
    wait_until(
        "the router to stop routing to the deleted pod",
        lambda: (
            request(
                f"{cluster.url('server')}/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                timeout=10,
            )[0]
            == 503
        ),
        10,
    )
    stopping.join(timeout=150)
    stream.join(timeout=60)
    assert "error" not in outcome, outcome.get("error")
    assert outcome["done"] and len([d for d in outcome["deltas"] if d]) == tokens, len(outcome["deltas"])
    grace = worker.pod.spec["terminationGracePeriodSeconds"]
    assert worker.stopped_in is not None and worker.stopped_in < grace, (worker.stopped_in, grace)
    print(f"worker pod stopped in {worker.stopped_in:.1f} s of its {grace} s grace period")
    assert worker.container("infera").process.returncode == 0, worker.container("infera").tail()
    if cluster.kube is not None:
        # It cleared its own record once signalled: after the preStop delay, not before.
        cleared = [
            call.at
            for call in cluster.kube.events
            if call.method == "PATCH"
            and call.path.endswith(f"/pods/{worker.name}")
            and (call.body or {}).get("metadata", {}).get("annotations", {}).get(WORKER_INFO, "") is None
        ]
        pre_stop = int(worker.pod.spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert cleared and cleared[0] - worker.stop_began >= pre_stop, (cleared, worker.stop_began, pre_stop)
        assert_calls_allowed(cluster)
    assert registered(cluster) == []


def ask_the_picker(cluster: Cluster, body: dict[str, Any]) -> dict[str, str]:
    """What an Inference Gateway does per request: open an ext_proc stream to the Endpoint Picker
    Service (TLS, verification off, as kgateway dials it), send the request's headers and body,
    and read the routing headers the picker sets."""
    import grpc

    sys.path.insert(0, str(cluster.shared / "upstream" / "runtime"))
    from infera.gaie.proto import ext_proc_pb2 as pb
    from infera.gaie.proto import ext_proc_pb2_grpc as pb_grpc

    epp = cluster.by_key[("Service", f"{cluster.name}-epp")]
    host, port = f"{cluster.name}-epp", epp["spec"]["ports"][0]["port"]
    certificate = ssl.get_server_certificate((host, port)).encode()  # self-signed: trusted as it is
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
    raw = json.dumps(body).encode()
    headers = pb.HeaderMap(
        headers=[
            pb.HeaderValue(key=k, raw_value=v.encode())
            for k, v in ((":method", "POST"), (":path", "/v1/chat/completions"), ("content-type", "application/json"))
        ]
    )
    messages = [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=headers)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True)),
    ]
    target_name = certificate_name(certificate)
    with grpc.secure_channel(
        f"{host}:{port}", credentials, options=[("grpc.ssl_target_name_override", target_name)]
    ) as channel:
        replies = list(pb_grpc.ExternalProcessorStub(channel).Process(iter(messages), timeout=10))
    decision = replies[-1].request_body.response.header_mutation.set_headers
    return {option.header.key: option.header.raw_value.decode() for option in decision}


def certificate_name(pem: bytes) -> str:
    from cryptography import x509

    certificate = x509.load_pem_x509_certificate(pem)
    return certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )[0]


def gateway_routes_to_the_group_leader(cluster: Cluster) -> None:
    """A two-node SGLang group fronted by the Inference Gateway's pieces: the ranks form their
    group with the rendezvous flags the operator injected; only rank 0 registers and gets the
    frontend sidecar; the Endpoint Picker sends the gateway to that sidecar on the pool's port,
    and the sidecar serves the request from the group."""
    start(cluster)
    leader, follower = cluster.pod_of("tp", 0), cluster.pod_of("tp", 1)
    status, group = request(f"http://{leader.ip}:{worker_port(leader)}/standin/group")
    assert status == 200 and group["ranks"] == [0, 1] and group["nnodes"] == 2, group
    assert [c.name for c in leader.containers] == ["infera", "infera-frontend"]
    assert [c.name for c in follower.containers] == ["infera"]
    frontend_port = cluster.spec["gaie"]["frontendPort"]
    frontend = f"http://{leader.ip}:{frontend_port}"
    worker_url = f"http://{leader.ip}:{worker_port(leader)}"
    wait_until(
        "rank 0, alone, registered", lambda: [w["url"] for w in registered(cluster, frontend)] == [worker_url], 30
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello world"}], "max_tokens": 4}
    picked = ask_the_picker(cluster, body)
    assert picked["x-gateway-destination-endpoint"] == f"{leader.ip}:{frontend_port}", picked
    status, reply = request(
        f"http://{picked['x-gateway-destination-endpoint']}/v1/chat/completions",
        body,
        headers={"x-worker-instance-id": picked["x-worker-instance-id"]},
    )
    assert status == 200, reply
    assert f"pod={leader.name}" in reply["choices"][0]["message"]["content"], reply
    # Rank 1 serves no API (as SGLang's other ranks): traffic sent there would fail.
    assert request(f"http://{follower.ip}:{worker_port(follower)}/v1/chat/completions", body)[0] == 404
    assert engine_requests(follower) == []
    assert_calls_allowed(cluster)

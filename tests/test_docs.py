"""The README's commands are the real ones: its curl call works, CI runs its test command."""

import json
import re
import shlex
import shutil
import subprocess

from tests.support.prerequisites import REPO, need, need_schemas
from tests.support.requests import controller, load_yaml, parent

README = (REPO / "README.md").read_text()


def shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README, flags=re.S)


def setup_section() -> str:
    return README.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]


def test_exactly_two_setup_commands() -> None:
    commands = re.findall(r"```sh\n(.*?)\n```", setup_section().split("Poke a running hook")[0], flags=re.S)
    assert len(commands) == 2
    serve, test = commands
    assert serve.endswith("infera-hooks serve")
    assert test.endswith("pytest")


def test_ci_runs_the_readme_test_command() -> None:
    test_command = re.findall(r"```sh\n(.*?)\n```", setup_section(), flags=re.S)[1]
    ci = (REPO / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
    assert "INFERA_REQUIRE_ALL=1" in ci


def test_readme_curl_call_answers_with_the_pd_graph(hook_url: str) -> None:
    need(shutil.which("curl") is not None, "curl is not on PATH")
    (command,) = [line for block in shell_blocks() for line in block.splitlines() if line.startswith("curl ")]
    argv = [arg.replace("http://127.0.0.1:8080", hook_url) for arg in shlex.split(command)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
    answer = json.loads(result.stdout)
    assert set(answer) == {"children", "status"}
    assert len(answer["children"]) == 11
    assert answer["status"]["state"] == "initializing"


def test_curl_request_body_matches_the_example_and_bundle() -> None:
    body = json.loads((REPO / "examples" / "requests" / "sync-qwen-pd.json").read_text())
    assert body["controller"] == controller()
    assert body["parent"]["spec"] == load_yaml(REPO / "examples" / "pd-disaggregated.yaml")[0]["spec"]


# --- "What runs in each pod" is what the hook renders -----------------------------------------


def pod_section() -> str:
    return README.split("### What runs in each pod", 1)[1].split("\n### ", 1)[0]


def table(text: str) -> list[list[str]]:
    """The rows of the first Markdown table in `text` (header and separator dropped)."""
    lines = text[text.index("\n|") + 1 :].splitlines()
    rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in lines[: next((i for i, line in enumerate(lines) if not line.startswith("|")), len(lines))]
    ]
    return rows[2:]


def words(cell: str, values: dict[str, str]) -> list[str]:
    """The flags written in a cell's code spans, placeholders filled in."""
    spans = " ".join(re.findall(r"`([^`]*)`", cell))
    return [re.sub(r"<(\w+)>", lambda m: values[m.group(1)], word) for word in spans.split()]


def test_what_runs_in_each_pod_is_what_the_hook_renders(hooks) -> None:
    """Each injected command is the README's start, then its rows in their order: no more, no less."""
    need_schemas()
    section = pod_section()
    starts = {row[0]: row[2] for row in table(section)}
    rows = table(section.split("followed by, depending on the spec:", 1)[1])
    columns = {"server": 1, "GAIE frontend": 1, "worker": 2, "Endpoint Picker": 3}
    for discovery in ("kubernetes", "etcd"):
        for nats in (True, False):
            spec = {
                "image": "rocm/infera:v0.2.10",
                "discoveryBackend": discovery,
                "nats": {"deploy": nats},
                "gaie": {"enabled": True, "tokenizerPath": "tok", "gatewayName": "gw", "frontendPort": 8100},
                "services": {
                    "server": {"componentType": "server", "args": ["--router-tokenizer-path", "tok"]},
                    "prefill": {"componentType": "worker", "role": "prefill", "args": ["--model-path", "m"]},
                    "tp": {"componentType": "worker", "numberOfNodes": 2, "port": 31000, "args": ["--model-path", "m"]},
                },
            }
            if discovery == "etcd":
                spec["etcdEndpoint"] = "etcd:2379"
            obj = parent(
                {
                    "apiVersion": "infera.amd.com/v1alpha1",
                    "kind": "InferaDeployment",
                    "metadata": {"name": "idep"},
                    "spec": spec,
                }
            )
            answer = hooks.sync(obj)
            assert answer["status"]["state"] == "initializing", answer["status"]["message"]
            applies = {
                "`discoveryBackend: kubernetes`": lambda s: discovery == "kubernetes",
                "`discoveryBackend: etcd`": lambda s: discovery == "etcd",
                "`role: prefill` or `decode`": lambda s: s == "prefill",
                "`gaie.enabled` (server)": lambda s: s == "server",
                "`nats.deploy: true`": lambda s: nats,
                "`nats.deploy: false`": lambda s: not nats,
                "SGLang, `numberOfNodes: N > 1`": lambda s: s == "tp",
            }
            assert [row[0] for row in rows] == list(applies)
            seen = set()
            for child in answer["children"]:
                group = child.get("spec", {}).get("leaderWorkerTemplate", {})
                templates = (
                    [child["spec"]["template"]]
                    if child["kind"] == "Deployment"
                    else (
                        [group["leaderTemplate"], group["workerTemplate"]] if child["kind"] == "LeaderWorkerSet" else []
                    )
                )
                for template in templates:
                    service = template["metadata"]["labels"]["infera.amd.com/service"]
                    for container in template["spec"]["containers"]:
                        process = {"infera-frontend": "GAIE frontend", "epp": "Endpoint Picker"}.get(
                            container["name"],
                            "worker"
                            if template["metadata"]["labels"].get("infera.amd.com/component") == "worker"
                            else "server",
                        )
                        port = (
                            {"server": "8000", "tp": "31000"}.get(service, "30000")
                            if container["name"] == "infera"
                            else "8100"
                        )
                        values = {
                            "idep": "idep",
                            "port": port,
                            "backend": "sglang",
                            "frontendPort": "8100",
                            "tokenizerPath": "tok",
                            "etcdEndpoint": "etcd:2379",
                            "role": "prefill",
                            "N": "2",
                        }
                        expected = words(starts[process], values)
                        for row in rows:
                            if applies[row[0]](service):
                                expected += words(row[columns[process]], values)
                        assert container["command"] == expected, (discovery, nats, service, process)
                        seen.add(process)
            assert seen == set(columns)


def test_the_probe_and_shutdown_figures_are_the_codes() -> None:
    from hooks import runtime

    section = pod_section()
    budget = runtime.MODEL_LOAD_SECONDS + runtime.STARTUP_SLACK_SECONDS
    for text in (
        f"up to {budget} s",
        f"`INFERA_ENGINE_READY_TIMEOUT={runtime.MODEL_LOAD_SECONDS}`",
        f"`preStop` sleep {runtime.PRESTOP_SECONDS} s",
        f"max({runtime.MIN_GRACE_SECONDS}, {runtime.PRESTOP_SECONDS} + drain + {runtime.TEARDOWN_SECONDS})",
    ):
        assert text in section, text

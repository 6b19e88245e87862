"""The README and docs/ tell the truth: the README is a short front door whose every command
runs (here, in another test, or in CI) or is a cluster step naming what the bundle installs;
every link resolves and every page is reachable; the reference tables are what the hook renders."""

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.docs import (
    DOCS,
    README,
    commands,
    readme_curl,
    readme_local_cluster,
    readme_overlay_script,
    readme_render,
    section,
    setup_commands,
    shell_blocks,
)
from tests.support.prerequisites import REPO, need, need_kubectl, need_schemas
from tests.support.requests import controller, load_yaml, parent

# The README stays a front door: what it is, trying it, installing (with what its pods may do),
# checking, uninstalling, links.
README_MAX_LINES = 200


def test_readme_is_a_short_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == [
        "## Set up on a fresh machine",
        "## Try it without a cluster",
        "## Install on a cluster",
        "## Check and troubleshoot",
        "## Uninstall",
        "## Documentation",
        "## License",
    ]


def test_the_readme_diagram_names_every_child_kind() -> None:
    from hooks import vocabulary

    diagram = README.read_text().split("```\n", 2)[1]
    assert [kind.kind for kind in vocabulary.CHILD_KINDS if kind.kind not in diagram] == []


def test_no_page_offers_renders_to_kubectl_apply() -> None:
    """Objects created from `render` lack Metacontroller's controller reference and block it."""
    for page in pages():
        text = " ".join(page.read_text().split())
        assert "kubectl apply -f -" not in text and "ready for `kubectl apply" not in text, page.name


def test_exactly_two_setup_commands() -> None:
    serve, test = setup_commands()
    assert serve == "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/infera-hooks serve"
    assert test == "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/pytest"


def test_ci_runs_the_readme_test_command_and_adds_only_that_nothing_may_skip() -> None:
    """What CI runs is what a new user runs: the suite prepares its own prerequisites."""
    _, test = setup_commands()
    ci = (REPO / ".ci" / "run").read_text()
    commands = [line for line in ci.splitlines() if line and not line.startswith("#")]
    assert commands == [
        "set -euo pipefail",
        'cd "$(dirname "$0")/.."',
        "export INFERA_REQUIRE_ALL=1",
        'command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"',
        test,
    ]


def test_readme_curl_call_answers_with_the_pd_graph(hook_url: str) -> None:
    need(shutil.which("curl") is not None, "curl is not on PATH")
    argv = [arg.replace("http://127.0.0.1:8080", hook_url) for arg in shlex.split(readme_curl())]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=30, check=True)
    answer = json.loads(result.stdout)
    assert set(answer) == {"children", "status"}
    assert len(answer["children"]) == 15
    assert answer["status"]["state"] == "initializing"


def test_curl_request_body_matches_the_example_and_bundle() -> None:
    body = json.loads((REPO / "examples" / "requests" / "sync-qwen-pd.json").read_text())
    assert body["controller"] == controller()
    assert body["parent"]["spec"] == load_yaml(REPO / "examples" / "pd-disaggregated.yaml")[0]["spec"]


def test_readme_render_command_previews_the_pd_graph() -> None:
    argv = shlex.split(readme_render())
    assert argv[0] == ".venv/bin/infera-hooks"
    executable = Path(sys.executable).with_name("infera-hooks")
    result = subprocess.run([str(executable), *argv[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (0, "qwen-pd: initializing: creating 3 services\n")
    assert len([doc for doc in yaml.safe_load_all(result.stdout) if doc]) == 15


# A command run against a cluster, which this suite cannot run: Docker builds and pushes,
# kubectl talking to an API server.
CLUSTER_STEP = re.compile(r"^(docker build |kubectl (apply|get|describe|wait|delete|-n \S+ logs) )")


def test_every_readme_command_runs_or_is_a_cluster_step() -> None:
    """Each command either runs in a test (or in CI), or is a cluster step whose files and
    objects exist: a new command must be run by a test or named a cluster step here."""
    kubectl = need_kubectl()
    run_by_tests = {*setup_commands(), readme_curl(), readme_render(), readme_overlay_script(), *readme_local_cluster()}
    written = [c for block in shell_blocks(README.read_text()) for c in commands(block)]
    cluster_steps = [c for c in written if c not in run_by_tests]
    assert set(written) >= run_by_tests
    assert [c for c in cluster_steps if not CLUSTER_STEP.match(c)] == []
    bundle = subprocess.run([kubectl, "kustomize", str(REPO)], capture_output=True, text=True, check=True).stdout
    objects = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in yaml.safe_load_all(bundle)}
    crd = yaml.safe_load((REPO / "crds" / "infera.amd.com_inferadeployments.yaml").read_text())
    for step in cluster_steps:
        words = shlex.split(step)
        if "-f" in words:
            assert (REPO / words[words.index("-f") + 1]).is_file(), step
        if "-k" in words and words[words.index("-k") + 1] == ".":
            assert ("CompositeController", None, "inferadeployment-controller") in objects, step
        if "idep" in words or any(word.startswith("idep/") for word in words):
            assert "idep" in crd["spec"]["names"]["shortNames"], step
        if "--for=condition=Ready" in words:
            status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            assert "conditions" in status["properties"], step
        if "logs" in words:
            namespace, target = words[words.index("-n") + 1], words[words.index("logs") + 1]
            assert ("Deployment", namespace, target.removeprefix("deploy/")) in objects, step


# --- links --------------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    found = set()
    for match in re.finditer(r"^#+ (.*)$", text, flags=re.M):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def pages() -> list[Path]:
    return [README, REPO / "CHANGELOG.md", *sorted(DOCS.glob("*.md"))]


def local_links(page: Path) -> list[tuple[Path, str]]:
    """(file, anchor) of each link to this repository in `page`."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    links = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        links.append(((page.parent / path).resolve() if path else page, anchor))
    return links


def test_every_link_resolves() -> None:
    broken = []
    for page in pages():
        for path, anchor in local_links(page):
            if not path.exists() or (anchor and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(REPO)}: {path.relative_to(REPO)}#{anchor}")
    assert broken == []


def test_every_page_of_the_docs_is_reachable_from_the_readme() -> None:
    reached, pending = {README}, [README]
    while pending:
        for path, _ in local_links(pending.pop()):
            if path.suffix == ".md" and path not in reached:
                reached.add(path)
                pending.append(path)
    assert sorted(p.name for p in DOCS.glob("*.md") if p not in reached) == []


def test_the_moved_reference_is_in_the_docs() -> None:
    """What the README held before it became a front door, each in its page."""
    for page, heading in [
        ("api.md", "What an InferaDeployment becomes"),
        ("api.md", "Status"),
        ("api.md", "Bad input"),
        ("pods.md", "Multi-node worker pools"),
        ("operations.md", "Limits"),
        ("operations.md", "HTTPS without cert-manager"),
        ("operations.md", "Observability"),
        ("operations.md", "Sizing Metacontroller for a fleet"),
        ("teardown.md", "Uninstalling"),
        ("migration.md", "Coming from the upstream operator"),
        ("development.md", "Layout"),
        ("performance.md", "A fleet on the real control plane"),
    ]:
        assert section(DOCS / page, heading).strip(), (page, heading)


def test_the_layout_names_every_module() -> None:
    layout = section(DOCS / "development.md", "Layout")
    modules = [p for p in (REPO / "hooks").glob("*.py") if p.name != "__init__.py"]
    missing = [p.name for p in modules if p.name not in layout and p.stem not in layout]
    assert missing == []


# --- docs/pods.md: "What runs in each pod" is what the hook renders -----------------------------------------


def pod_section() -> str:
    return section(DOCS / "pods.md", "What runs in each pod").split("\n## Multi-node worker pools", 1)[0]


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
    """Each injected command is the page's start, then its rows in their order: no more, no less."""
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


def test_the_names_tables_are_the_hooks() -> None:
    """docs/api.md's Names: every name the hook gives a child, and each kind's limit, as
    hooks/api/names.py holds them."""
    from hooks.api import name_rules, names

    text = section(DOCS / "api.md", "Names")
    assert table(text) == [
        [
            f"`{name.pattern}`",
            name_rules.listed(name.kinds) + (f" (made by {name.made_by})" if name.made_by else ""),
            name.when.words.strip() or "always",
            "no limit" if name.limit is None else str(name.limit),
        ]
        for name in names.NAMES
    ]
    kinds = text[text.index("\n| kind |") :]
    assert table(kinds) == [
        [kind, "no limit" if limit.characters is None else str(limit.characters), limit.why]
        for kind, limit in names.KIND_LIMITS.items()
    ]

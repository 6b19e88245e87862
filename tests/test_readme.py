"""The README's commands are the real ones: its curl call works, CI runs its test command."""

import json
import re
import shlex
import shutil
import subprocess

from tests.conftest import REPO, need

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
    assert len(answer["children"]) == 9
    assert answer["status"]["state"] == "initializing"


def test_curl_request_body_matches_the_example_and_bundle() -> None:
    from tests.conftest import controller, load_yaml

    body = json.loads((REPO / "examples" / "requests" / "sync-qwen-pd.json").read_text())
    assert body["controller"] == controller()
    assert body["parent"]["spec"] == load_yaml(REPO / "examples" / "pd-disaggregated.yaml")[0]["spec"]

"""The README and docs/ as the tests read them: sections, shell blocks and the commands in them."""

import re
import textwrap
from pathlib import Path

from tests.support.prerequisites import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
HEADING = re.compile(r"^(#+) (.*)$", flags=re.M)


def section(path: Path, heading: str) -> str:
    """The text under `heading` (without its #s), up to the next heading of its level or above."""
    text = path.read_text()
    for match in HEADING.finditer(text):
        if match.group(2) == heading:
            level = len(match.group(1))
            rest = text[match.end() :]
            end = next((m.start() for m in HEADING.finditer(rest) if len(m.group(1)) <= level), len(rest))
            return rest[:end]
    raise AssertionError(f"{path.relative_to(REPO)} has no heading {heading!r}")


def shell_blocks(text: str) -> list[str]:
    """The ```sh blocks of `text`, an indented one (in a list item) dedented."""
    return [textwrap.dedent(body) for _, body in re.findall(r"^( *)```sh\n(.*?)\n\1```$", text, flags=re.S | re.M)]


def commands(block: str) -> list[str]:
    """A shell block's commands: its lines, with a heredoc kept whole with the line that opens
    it, and the comment that follows a command dropped."""
    found: list[str] = []
    lines = iter(block.splitlines())
    for line in lines:
        line = line.strip()
        if not line:
            continue
        heredoc = re.search(r"<<'?(\w+)'?", line)
        if heredoc:
            body = []
            for inner in lines:
                body.append(inner)
                if inner.strip() == heredoc.group(1):
                    break
            found.append("\n".join([line, *body]))
        else:
            found.append(re.sub(r"\s+# .*$", "", line))
    return found


def setup_commands() -> tuple[str, str]:
    """The README's two set-up commands: serve, and run the tests."""
    serve, test = shell_blocks(section(README, "Set up on a fresh machine"))
    return serve, test


def readme_command(start: str) -> str:
    """The one README command that starts with `start`."""
    (command,) = [c for block in shell_blocks(README.read_text()) for c in commands(block) if c.startswith(start)]
    return command


def readme_curl() -> str:
    return readme_command("curl ")


def readme_render() -> str:
    return readme_command(".venv/bin/infera-hooks render ")


def readme_overlay_script() -> str:
    """The command that writes the README's overlay beside the clone."""
    return readme_command("mkdir -p ../infera-install")


def readme_local_cluster() -> tuple[str, str]:
    """The README's commands that bring a local control plane up and tear it down."""
    (up,) = [c for block in shell_blocks(README.read_text()) for c in commands(block) if c.endswith("localcluster up")]
    (down,) = [
        c for block in shell_blocks(README.read_text()) for c in commands(block) if c.endswith("localcluster down")
    ]
    return up, down

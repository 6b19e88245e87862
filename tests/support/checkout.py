"""A copy of this checkout as a fresh clone would have it: its files, without what the working
tree has installed or cached (.venv, __pycache__, egg-info)."""

import shutil
import subprocess
from pathlib import Path

from tests.support.prerequisites import REPO

# Without git (a tarball of the tree), the same as .gitignore leaves out.
UNTRACKED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", ".pytest_cache")


def copy_checkout(into: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) copied into `into`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
    )
    if listed.returncode != 0:
        shutil.copytree(REPO, into, ignore=UNTRACKED)
        return into
    for name in listed.stdout.decode().split("\0"):
        source = REPO / name
        if name and source.is_file():  # a file deleted but not yet committed is listed too
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into

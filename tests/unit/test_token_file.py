"""The bearer token file: re-read at most once a second, a rotation by content, the previous
token for a while after it, and the last good token through a missing or empty file. Times
come from an injected monotonic clock."""

import os
from pathlib import Path

from hooks.auth import REREAD_SECONDS, ROTATION_OVERLAP_SECONDS, TokenFile


def test_token_rotation_follows_content_and_a_monotonic_clock(tmp_path: Path) -> None:
    now = [1000.0]
    token_file = tmp_path / "token"
    token_file.write_text("one")
    stamp = token_file.stat().st_mtime_ns
    tokens = TokenFile(str(token_file), clock=lambda: now[0])
    token_file.write_text("two")
    os.utime(token_file, ns=(stamp, stamp))  # same timestamp: only the content says it changed
    assert tokens.admits("Bearer two") is False  # read at most once a second
    now[0] += 1
    assert tokens.admits("Bearer two") and tokens.admits("Bearer one")
    now[0] += ROTATION_OVERLAP_SECONDS - 0.5
    assert tokens.admits("Bearer one")
    now[0] += 0.5
    assert not tokens.admits("Bearer one") and tokens.admits("Bearer two")


def test_a_missing_or_empty_file_keeps_the_last_token(tmp_path: Path) -> None:
    """The kubelet swapping a Secret's files: for a moment the file is missing, or empty."""
    now = [1000.0]
    token_file = tmp_path / "token"
    token_file.write_text("one")
    tokens = TokenFile(str(token_file), clock=lambda: now[0])
    token_file.unlink()
    now[0] += REREAD_SECONDS
    assert tokens.admits("Bearer one")
    token_file.write_text("")
    now[0] += REREAD_SECONDS
    assert tokens.admits("Bearer one") and not tokens.admits("Bearer ")
    token_file.write_text("two")
    now[0] += REREAD_SECONDS
    assert tokens.admits("Bearer two") and tokens.admits("Bearer one")

"""The bearer token hook calls must carry, read from a file (a mounted Secret)."""

import hmac
import logging
import time
from collections.abc import Callable

log = logging.getLogger("hooks")
# How stale the token may be: the file is re-read at most this often, not on every call.
REREAD_SECONDS = 1.0
# After a rotation, the previous token stays valid this long: Metacontroller reads the Secret
# on its own schedule, the kubelet updates the mounted file on another (up to a minute or two),
# and neither order may reject a hook call.
ROTATION_OVERLAP_SECONDS = 300.0


class TokenFileError(ValueError):
    """The token file cannot be used at start-up: `serve` refuses to start."""


class TokenFile:
    """The current token, and the previous one for a while after a rotation.

    A rotation is a change of content (a Secret volume swaps files; timestamps can repeat).
    A file that is briefly missing or empty, as during that swap, keeps the last good token.
    Times come from a monotonic clock: a wall clock that jumps changes nothing.
    """

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        token = self._read()
        if token is None:
            raise TokenFileError(f"--auth-token-file {path}: {self._problem}")
        self._token = token
        self._previous: bytes | None = None
        self._previous_until = 0.0
        self._read_at = clock()

    def _read(self) -> bytes | None:
        try:
            with open(self.path, "rb") as stream:
                token = stream.read().strip()
        except OSError as error:
            self._problem = error.strerror or type(error).__name__
            return None
        self._problem = "the file is empty"
        return token or None

    def _refresh(self, now: float) -> None:
        if now - self._read_at < REREAD_SECONDS:
            return
        self._read_at = now
        token = self._read()
        if token is None:
            log.warning("the auth token file %s cannot be used (%s): keeping the last token", self.path, self._problem)
        elif token != self._token:
            self._previous, self._previous_until, self._token = self._token, now + ROTATION_OVERLAP_SECONDS, token
            log.info("the auth token changed; the previous one is accepted for %d s more", ROTATION_OVERLAP_SECONDS)

    def admits(self, header: str | None) -> bool:
        scheme, _, credential = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        now = self._clock()
        self._refresh(now)
        presented = credential.strip().encode()
        # compare_digest takes the same time whatever prefix matches.
        if hmac.compare_digest(presented, self._token):
            return True
        return (
            self._previous is not None and now < self._previous_until and hmac.compare_digest(presented, self._previous)
        )

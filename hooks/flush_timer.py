"""Writing noted data in batches, within a bound of time."""

import threading
from collections.abc import Callable


class FlushTimer:
    """Calls `flush` within `seconds` of any call to `due`, one timer at a time: under load, one
    flush per `seconds` however often `due` is called. Per process: a new one after a fork."""

    def __init__(self, seconds: float, flush: Callable[[], None]) -> None:
        self.seconds = seconds
        self._flush = flush
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def due(self) -> None:
        """Call with no lock held: in a gevent worker, starting a thread switches greenlets, and
        one that then waited for an (OS) lock held here would block the whole worker."""
        if self._timer is not None:  # the common case, read without the lock (checked again under it)
            return
        with self._lock:
            if self._timer is not None:
                return
            timer = self._timer = threading.Timer(self.seconds, self._fire)
            timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no thread to be had: the next call tries again (and fails no call)
            with self._lock:
                self._timer = None

    def _fire(self) -> None:
        with self._lock:
            self._timer = None
        self._flush()

"""Where `serve` keeps its metrics, and what keeps that place small.

gunicorn workers are processes, so prometheus_client's multiprocess mode gives each worker files
of its own in PROMETHEUS_MULTIPROC_DIR and sums them at scrape time. The directory sits in the
pod's /tmp, a 16 Mi in-memory volume, and two things would grow there without bound: a series
per InferaDeployment (an entry in every worker's files, never removed) and the files of every
worker that ever died. So:

- InferaDeployment states live in one SQLite table, a row per InferaDeployment that has not been
  finalized, written only when a state changes;
- the master folds a dead worker's counters and histograms into one `*_merged.db` file per type;
- a scrape holds a shared lock and a fold an exclusive one, so no scrape counts a dead worker's
  calls twice or not at all (counters must never go down).
"""

import fcntl
import glob
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PREFIX = "infera-hooks-metrics-"
STATES_FILE = "inferadeployment-states.sqlite"
LOCK_FILE = "scrape.lock"
# prometheus_client takes a file's metric type from its name up to the first '_'.
FOLDED_TYPES = ("counter", "histogram")


def create() -> str:
    """A new directory owned by this (master) process, named after its PID. Directories whose
    master is gone are removed first: a master killed outright never cleans up, and the pod's
    /tmp outlives its container."""
    for directory in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*-*")):
        owner = os.path.basename(directory)[len(PREFIX) :].split("-", 1)[0]
        # In a restarted container the master has the old one's PID (1) but not its directory.
        if owner.isdigit() and (int(owner) == os.getpid() or not _alive(int(owner))):
            shutil.rmtree(directory, ignore_errors=True)
    directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    open(os.path.join(directory, LOCK_FILE), "x").close()
    StateTable(os.path.join(directory, STATES_FILE)).check()  # the table exists before any worker
    return directory


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def locked(directory: str, exclusive: bool = False) -> Iterator[None]:
    """Shared for a scrape, exclusive for a fold."""
    with open(os.path.join(directory, LOCK_FILE), "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield  # closing the file releases the lock


def fold_dead_worker(directory: str, pid: int) -> None:
    """Add a dead worker's counters and histograms into the merged files and delete its own:
    whatever the number of worker restarts, the directory holds one file per type for them."""
    # Imported here: prometheus_client picks its storage when first imported, which must be after
    # `serve` has created this directory and pointed PROMETHEUS_MULTIPROC_DIR at it.
    from prometheus_client.mmap_dict import MmapedDict

    with locked(directory, exclusive=True):
        for metric_type in FOLDED_TYPES:
            dead = os.path.join(directory, f"{metric_type}_{pid}.db")
            if not os.path.exists(dead):
                continue
            merged = MmapedDict(os.path.join(directory, f"{metric_type}_merged.db"))
            try:
                for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(dead):
                    total, _ = merged.read_value(key)
                    merged.write_value(key, total + value, timestamp)
            finally:
                merged.close()
            os.remove(dead)


# A row not refreshed for this long goes: the InferaDeployment was finalized through the other
# hook replica, or is gone. Metacontroller resyncs every parent far more often than that.
STATE_EXPIRY_SECONDS = 30 * 60
# A row's last-seen time is rewritten at most this often: most calls only read.
STATE_REFRESH_SECONDS = 60
# Rows kept at most (about 80 bytes each); past that, new InferaDeployments are not recorded.
MAX_STATES = 50_000


class StateTable:
    """The state each InferaDeployment was last answered with: one row per InferaDeployment,
    shared by the workers (SQLite serialises their writes). `:memory:` outside `serve`.

    Times are the monotonic clock's, which every process on the host shares: a wall clock
    that jumps neither expires nor keeps rows."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._db: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # a connection must not cross a fork
            db = sqlite3.connect(self.path, timeout=5, isolation_level=None, check_same_thread=False)
            # Write-ahead logging: a scrape reading never blocks a hook call writing, and a worker
            # killed mid-write leaves the table intact. The log is checkpointed at 256 pages and
            # truncated to 1 MiB; on a memory volume there is nothing to sync.
            for pragma in (
                "journal_mode=WAL",
                "synchronous=OFF",
                "wal_autocheckpoint=256",
                "journal_size_limit=1048576",
            ):
                db.execute(f"PRAGMA {pragma}")
            db.execute(
                "CREATE TABLE IF NOT EXISTS states (namespace TEXT NOT NULL, name TEXT NOT NULL, state TEXT NOT NULL,"
                " seen REAL NOT NULL, PRIMARY KEY (namespace, name)) WITHOUT ROWID"
            )
            self._pid, self._db = os.getpid(), db
        assert self._db is not None
        return self._db

    def set(self, namespace: str, name: str, state: str | None) -> bool:
        """Record a state, or forget the InferaDeployment (None). Reads first: most calls
        repeat the state already there, and a read takes no write lock. False when a new
        InferaDeployment was not recorded because the table is full."""
        now = self._clock()
        with self._lock:
            db = self._connection()
            key = (namespace, name)
            row = db.execute("SELECT state, seen FROM states WHERE namespace = ? AND name = ?", key).fetchone()
            if state is None:
                if row is not None:
                    db.execute("DELETE FROM states WHERE namespace = ? AND name = ?", key)
            elif row is None:
                if db.execute("SELECT count(*) FROM states").fetchone()[0] >= MAX_STATES:
                    return False
                db.execute("INSERT INTO states VALUES (?, ?, ?, ?)", (*key, state, now))
            elif row[0] != state or now - row[1] >= STATE_REFRESH_SECONDS:
                db.execute("UPDATE states SET state = ?, seen = ? WHERE namespace = ? AND name = ?", (state, now, *key))
        return True

    def check(self) -> None:
        """Raise sqlite3.Error unless the table can be read."""
        with self._lock:
            self._connection().execute("SELECT 1 FROM states LIMIT 1").fetchall()

    def rows(self) -> list[tuple[str, str, str]]:
        """Every recorded state, after dropping those not seen for STATE_EXPIRY_SECONDS."""
        with self._lock:
            db = self._connection()
            db.execute("DELETE FROM states WHERE seen < ?", (self._clock() - STATE_EXPIRY_SECONDS,))
            return db.execute("SELECT namespace, name, state FROM states ORDER BY 1, 2").fetchall()

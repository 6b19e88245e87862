"""Where `serve` keeps its metrics, and what keeps that place small.

gunicorn workers are processes, so prometheus_client's multiprocess mode gives each worker files
of its own in PROMETHEUS_MULTIPROC_DIR and sums them at scrape time. The directory sits in the
pod's /tmp, a 16 Mi in-memory volume, and two things would grow there without bound: a series
per InferaDeployment (an entry in every worker's files, never removed) and the files of every
worker that ever died. So:

- InferaDeployment states live in one SQLite table, a row per InferaDeployment, which each
  worker writes in batches;
- the master folds a dead worker's counters and histograms into one `*_merged.db` file per type;
- a scrape holds a shared lock and a fold an exclusive one, so no scrape counts a dead worker's
  calls twice or not at all (counters must never go down).
"""

import fcntl
import glob
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hooks.flush_timer import FlushTimer

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


# A row not written for this long goes: the InferaDeployment was finalized through the other
# hook replica, or is gone. Metacontroller resyncs every parent far more often than that.
STATE_EXPIRY_SECONDS = 30 * 60
# A worker writes the states it answered at most this often, in one transaction: a call only
# notes its state (a SQLite statement on every call was a tenth of a distinct sync's cost). A
# state reaches /metrics this much later, at most.
FLUSH_SECONDS = 0.5
# Rows kept at most (about 80 bytes each); past that, new InferaDeployments are not recorded.
MAX_STATES = 50_000

log = logging.getLogger("hooks")
Key = tuple[str, str]  # (namespace, name)


class StateTable:
    """The state each InferaDeployment was last answered with: one row per InferaDeployment,
    shared by the workers (SQLite serialises their writes). `:memory:` outside `serve`.

    Each worker notes what it answered and writes its notes in batches, with the time of each
    answer: the latest answer wins whichever worker writes last, and a finalized InferaDeployment
    keeps a row without a state until it expires, so an earlier answer written later cannot bring
    it back. Times are the monotonic clock's, which every process on the host shares: a wall
    clock that jumps neither expires nor keeps rows."""

    def __init__(self, path: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._db: sqlite3.Connection | None = None
        self._noted: dict[Key, tuple[str | None, float]] = {}
        self._noted_pid = os.getpid()
        self._flush_timer = FlushTimer(FLUSH_SECONDS, self.flush)

    def _connection(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # a connection must not cross a fork
            db = sqlite3.connect(self.path, timeout=5, isolation_level=None, check_same_thread=False)
            # Write-ahead logging: a scrape reading never blocks a worker writing, and a worker
            # killed mid-write leaves the table intact. The log is checkpointed at 256 pages and
            # truncated to 1 MiB; on a memory volume there is nothing to sync.
            for pragma in (
                "journal_mode=WAL",
                "synchronous=OFF",
                "wal_autocheckpoint=256",
                "journal_size_limit=1048576",
            ):
                db.execute(f"PRAGMA {pragma}")
            # A finalized InferaDeployment's row has no state.
            db.execute(
                "CREATE TABLE IF NOT EXISTS states (namespace TEXT NOT NULL, name TEXT NOT NULL, state TEXT,"
                " seen REAL NOT NULL, PRIMARY KEY (namespace, name)) WITHOUT ROWID"
            )
            self._pid, self._db = os.getpid(), db
        assert self._db is not None
        return self._db

    def set(self, namespace: str, name: str, state: str | None) -> None:
        """Note the state an InferaDeployment was answered with, or None when it was finalized:
        written within FLUSH_SECONDS."""
        now = self._clock()
        with self._lock:
            # Never the database here: a table that cannot be opened must not fail the answer.
            if self._noted_pid != os.getpid():  # notes (and a timer) do not cross a fork
                self._noted, self._noted_pid = {}, os.getpid()
                self._flush_timer = FlushTimer(FLUSH_SECONDS, self.flush)
            self._noted[(namespace, name)] = (state, now)
        self._flush_timer.due()

    def flush(self) -> None:
        """Write the noted states now. A failure is logged (the table's health is /healthz's):
        the states are noted again on the next sync of each."""
        with self._lock:
            noted, self._noted = self._noted, {}
            if not noted:
                return
            try:
                full = self._write(self._connection(), noted)
            except sqlite3.Error as error:
                log.warning("could not record the states of %s InferaDeployments: %s", len(noted), error)
                return
        for namespace, name in full:
            log.warning(
                "not recording the state of %s/%s: %s states recorded already", namespace, name, f"{MAX_STATES:,}"
            )

    @staticmethod
    def _write(db: sqlite3.Connection, noted: dict[Key, tuple[str | None, float]]) -> list[Key]:
        """Write `noted` in one transaction, each unless a later answer is written already;
        return those left out because the table is full."""
        full = []
        db.execute("BEGIN IMMEDIATE")
        try:
            room = MAX_STATES - db.execute("SELECT count(*) FROM states").fetchone()[0]
            for key, (state, seen) in noted.items():
                if (
                    room < len(noted)
                    and not db.execute("SELECT 1 FROM states WHERE namespace = ? AND name = ?", key).fetchone()
                ):
                    if room <= 0:
                        if state is not None:  # a finalized one not recorded is as good as gone
                            full.append(key)
                        continue
                    room -= 1
                db.execute(
                    "INSERT INTO states VALUES (?, ?, ?, ?) ON CONFLICT (namespace, name) DO UPDATE"
                    " SET state = excluded.state, seen = excluded.seen WHERE excluded.seen >= states.seen",
                    (*key, state, seen),
                )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # SQLite rolls some failures back itself
                db.execute("ROLLBACK")
            raise
        return full

    def check(self) -> None:
        """Raise sqlite3.Error unless the table can be read."""
        with self._lock:
            self._connection().execute("SELECT 1 FROM states LIMIT 1").fetchall()

    def rows(self) -> list[tuple[str, str, str]]:
        """Every recorded state (this worker's notes written first), after dropping rows not
        written for STATE_EXPIRY_SECONDS."""
        self.flush()
        with self._lock:
            db = self._connection()
            db.execute("DELETE FROM states WHERE seen < ?", (self._clock() - STATE_EXPIRY_SECONDS,))
            return db.execute(
                "SELECT namespace, name, state FROM states WHERE state IS NOT NULL ORDER BY 1, 2"
            ).fetchall()

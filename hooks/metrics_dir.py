"""Where `serve` keeps its metrics, and what keeps that place small.

gunicorn workers are processes, so prometheus_client's multiprocess mode gives each worker files
of its own in PROMETHEUS_MULTIPROC_DIR and sums them at scrape time. The directory sits in the
pod's /tmp, a 16 Mi in-memory volume, where the files of every worker that ever died would
pile up without bound. So:

- the master folds a dead worker's counters and histograms into one `*_merged.db` file per type;
- a scrape holds a shared lock and a fold an exclusive one, so no scrape counts a dead worker's
  calls twice or not at all (counters must never go down).
"""

import fcntl
import glob
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

PREFIX = "infera-hooks-metrics-"
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

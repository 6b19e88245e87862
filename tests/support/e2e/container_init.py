"""What a container runtime does in a container's own mount namespace before it starts the
command (tests only; stdlib only, run with `python -I`):

    container_init.py SETUP_JSON -- ARGV...

SETUP_JSON: {"read_only_root": bool, "mounts": [[source, target, read_only], ...],
"image_paths": [path, ...], "user": [uid, gid] | null}.

1. The root is made read-only, all of it but /proc and /dev, when the container asks for a
   read-only root filesystem.
2. Its volumes are mounted where it mounts them. The image is this machine's files: where a
   volume covers a directory the image needs (CI keeps the checkout and its virtualenv under
   /tmp, where the scratch emptyDir goes), that directory is mounted back, read-only when the
   root is, at its own path inside the volume.
3. The command is started as the container's user, in a user namespace of its own that maps
   that uid and gid (an unprivileged process can map only itself): it has no capabilities, and
   only the read-only mounts stop it writing the files this machine's user owns.
"""

import ctypes
import json
import os
import subprocess
import sys
import tempfile

SYS_MOUNT_SETATTR = 442  # x86_64 and aarch64
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1


class MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def set_read_only(path: str, read_only: bool = True, recursive: bool = True) -> None:
    """mount_setattr(2) on the mount at `path` (and every mount below it, `recursive`)."""
    attr = MountAttr(MOUNT_ATTR_RDONLY if read_only else 0, 0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), flags, ctypes.byref(attr), ctypes.sizeof(attr)):
        error = ctypes.get_errno()
        raise OSError(error, f"mount_setattr {path}: {os.strerror(error)}")


def bind(source: str, target: str) -> None:
    subprocess.run(["mount", "--no-mtab", "--rbind", source, target], check=True)


def within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def main(setup: dict, argv: list[str]) -> None:
    mounts = [(source, target, read_only) for source, target, read_only in setup["mounts"]]
    for _, target, _ in mounts:
        os.makedirs(target, exist_ok=True)  # on the node's root, before it is read-only
    # The image's directories that a volume will cover, held where they stay reachable.
    held: dict[str, str] = {}
    for path in setup["image_paths"]:
        if any(within(path, target) and path != target for _, target, _ in mounts):
            held[path] = tempfile.mkdtemp(dir="/run")
            bind(path, held[path])
    if setup["read_only_root"]:
        set_read_only("/")
        for kept in ("/proc", "/dev"):
            set_read_only(kept, False)
    for source, target, read_only in sorted(mounts, key=lambda mount: mount[1].count("/")):
        bind(source, target)
        # A bind mount starts with its source's flags, read-only under a read-only root.
        set_read_only(target, False, recursive=False)
        for path in [path for path in held if within(path, target)]:
            os.makedirs(path, exist_ok=True)
            subprocess.run(["mount", "--no-mtab", "--move", held.pop(path), path], check=True)
        set_read_only(target, read_only, recursive=False)
    user = setup["user"]
    if user is not None:
        argv = ["unshare", "--user", f"--map-user={user[0]}", f"--map-group={user[1]}", "--", *argv]
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    separator = sys.argv.index("--")
    main(json.loads(sys.argv[1]), sys.argv[separator + 1 :])

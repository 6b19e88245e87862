"""The rendezvous of a multi-node group, as far as a test can see one.

SGLang with `--nnodes N` does not serve before torch.distributed's init_process_group returns,
which needs every rank: rank 0 listens on `--dist-init-addr`'s port, and the others connect to
that address. The stand-in does the same over plain TCP (each rank sends its `--node-rank`,
rank 0 answers once all N have joined), so the group forms only if every rank's command line
names the same, reachable leader and a distinct rank: what the operator's injected rendezvous
flags must achieve.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass

logger = logging.getLogger("sglang.standin.group")

# init_process_group's own default.
RENDEZVOUS_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class Group:
    nnodes: int
    node_rank: int
    leader: str  # host:port of rank 0
    ranks: tuple[int, ...]  # the ranks that joined, as rank 0 saw them


def form(nnodes: int, node_rank: int, dist_init_addr: str, timeout: float = RENDEZVOUS_TIMEOUT_S) -> Group:
    """Block until the whole group has joined; SystemExit when it does not in time."""
    host, _, port = dist_init_addr.rpartition(":")
    if node_rank == 0:
        return _lead(nnodes, host, int(port), dist_init_addr, timeout)
    return _join(nnodes, node_rank, host, int(port), dist_init_addr, timeout)


def _lead(nnodes: int, host: str, port: int, address: str, timeout: float) -> Group:
    with socket.create_server(("", port), reuse_port=False) as listener:
        listener.settimeout(timeout)
        joined: dict[int, socket.socket] = {}
        try:
            while len(joined) < nnodes - 1:
                peer, _ = listener.accept()
                rank = int(peer.makefile().readline())
                if rank in joined or not 0 < rank < nnodes:
                    raise SystemExit(f"rank {rank} joined the group at {address} twice or out of range")
                joined[rank] = peer
            for peer in joined.values():
                peer.sendall(b"ready\n")
        except TimeoutError:
            raise SystemExit(
                f"the group at {address} did not form: ranks {sorted(joined)} of {nnodes - 1} joined"
            ) from None
        finally:
            for peer in joined.values():
                peer.close()
    logger.info("group of %d formed at %s: ranks %s joined", nnodes, address, sorted(joined))
    return Group(nnodes, 0, address, (0, *sorted(joined)))


def _join(nnodes: int, node_rank: int, host: str, port: int, address: str, timeout: float) -> Group:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=5) as leader:
                leader.sendall(f"{node_rank}\n".encode())
                leader.settimeout(max(1.0, deadline - time.monotonic()))
                if leader.makefile().readline().strip() == "ready":
                    logger.info("rank %d joined the group at %s", node_rank, address)
                    return Group(nnodes, node_rank, address, ())
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"rank {node_rank} could not join the group at {address}") from None
            time.sleep(0.2)

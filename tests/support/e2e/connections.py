"""Every connection that crosses the sandbox's pod network, as a packet capture on its bridge
sees it (tests only).

The bridge (`cni0`) joins every pod's veth and is the node's own address, so a capture on it in
promiscuous mode sees pod-to-pod traffic as well as traffic to and from the node. A TCP
connection is recorded at its first SYN, a UDP flow at its first datagram; what stays inside a
pod (its loopback, its own address) never reaches the bridge, as it never reaches a CNI's
NetworkPolicy either."""

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass

ETH_P_ALL = 0x0003
ETH_P_IP = 0x0800
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_PROMISC = 1
TCP, UDP = 6, 17
SYN, ACK = 0x02, 0x10


@dataclass(frozen=True, order=True)
class Connection:
    source: str
    destination: str
    port: int
    protocol: str  # TCP or UDP


def parse(frame: bytes) -> Connection | None:
    """The connection an Ethernet frame opens: a TCP SYN (not a SYN-ACK), or any UDP datagram."""
    if len(frame) < 34 or frame[12:14] != struct.pack("!H", ETH_P_IP):
        return None
    packet = frame[14:]
    header = (packet[0] & 0x0F) * 4
    protocol = packet[9]
    segment = packet[header:]
    if protocol == TCP and len(segment) >= 14:
        flags = segment[13]
        if not flags & SYN or flags & ACK:
            return None
    elif protocol != UDP or len(segment) < 4:
        return None
    (port,) = struct.unpack("!H", segment[2:4])
    return Connection(
        socket.inet_ntoa(packet[12:16]), socket.inet_ntoa(packet[16:20]), port, "TCP" if protocol == TCP else "UDP"
    )


class ConnectionLog:
    """Captures on `interface` from construction until `stop()`; `seen` is every distinct
    connection (source, destination, port, protocol) so far."""

    def __init__(self, interface: str) -> None:
        self._socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._socket.bind((interface, 0))
        # Promiscuous: the bridge then hands up frames it forwards between two pods, too.
        membership = struct.pack("IHH8s", socket.if_nametoindex(interface), PACKET_MR_PROMISC, 0, b"")
        self._socket.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, membership)
        self._seen: set[Connection] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._capture, daemon=True)
        self._thread.start()

    def _capture(self) -> None:
        with contextlib.suppress(OSError):  # stopped
            while frame := self._socket.recv(65535):
                connection = parse(frame)
                if connection is not None:
                    with self._lock:
                        self._seen.add(connection)

    @property
    def seen(self) -> set[Connection]:
        with self._lock:
            return set(self._seen)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()
        self._thread.join(timeout=5)

"""Loopback ports for the processes gpulens' own tools start (bench, soak, conformance, demo)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS reports free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:port now (servers set SO_REUSEADDR, so do we:
    a port in TIME_WAIT after the previous run is free for them)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int, taken: set[int]) -> int:
    """`preferred` when it is free and not in `taken`, else any free port not in `taken`."""
    if preferred not in taken and port_free(preferred):
        return preferred
    while True:
        port = free_port()
        if port not in taken:
            return port

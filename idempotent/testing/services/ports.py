"""Ports on 127.0.0.1: free ones for a new broker, and whether one answers a connection.

Part of the services helpers of :mod:`idempotent.testing.services`.
"""

from __future__ import annotations

import socket

from idempotent.testing.services.state import _HOST


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_HOST, port))
        except OSError:
            return False
    return True


def _free_ports(count: int, exclude: set[int]) -> list[int]:
    ports: list[int] = []
    socks = []
    try:
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((_HOST, 0))
            port = int(sock.getsockname()[1])
            if port not in exclude and port not in ports:
                ports.append(port)
    finally:
        for sock in socks:
            sock.close()
    return ports


def _can_connect(port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((_HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- state

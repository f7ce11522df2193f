"""Where gunicorn listens: one socket, or with several API processes one SO_REUSEPORT each."""

from __future__ import annotations

import socket


def gunicorn_listening(host: str, port: int, workers: int) -> dict[str, object]:
    """gunicorn's `bind` and `reuse_port` settings for `workers` API processes.

    On one shared socket the process that wakes first accepts every connection then waiting,
    so kept-alive clients that connect together can all land on one process while the other
    idles (bench/host.py saw 436 requests to 0 at 8 streams). With a socket each, the kernel
    spreads the connections over the processes by a hash of each client's address and port.
    """
    return {"bind": f"{host}:{port}", "reuse_port": workers > 1}


def claim_port(host: str, port: int) -> int:
    """`port`, checked free by a plain bind; for 0, a free port the kernel picks.

    SO_REUSEPORT sockets of one user may share a port, so a second server started on a busy
    port would quietly take some of the first one's connections; a bind without that option
    fails instead, as it does for any other program listening there. Raises OSError.
    """
    family, kind, protocol, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with socket.socket(family, kind, protocol) as probe:
        # As gunicorn binds: a port whose last connections linger in TIME_WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
        return int(probe.getsockname()[1])

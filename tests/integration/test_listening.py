"""`helios serve`'s listening: a socket per API process with several, and a busy port refused."""

from __future__ import annotations

import socket

import pytest

from adapters.cli.listening import claim_port, gunicorn_listening


def test_one_api_process_shares_gunicorn_s_socket_and_several_take_one_each() -> None:
    assert gunicorn_listening("127.0.0.1", 8000, 1) == {
        "bind": "127.0.0.1:8000",
        "reuse_port": False,
    }
    assert gunicorn_listening("127.0.0.1", 8000, 2)["reuse_port"] is True


def test_port_zero_claims_a_free_port_that_a_server_can_then_bind() -> None:
    port = claim_port("127.0.0.1", 0)

    assert port > 0
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", port))


def test_a_port_a_sharing_listener_holds_is_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        with pytest.raises(OSError, match="Address already in use"):
            claim_port("127.0.0.1", holder.getsockname()[1])


def test_a_port_whose_last_server_has_closed_is_free_again() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        # The server side closes first, so its end of the connection lingers in TIME_WAIT.
        accepted.close()
        client.close()

    assert claim_port("127.0.0.1", port) == port

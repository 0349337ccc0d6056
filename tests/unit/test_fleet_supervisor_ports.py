"""`eventfleet fleet` reports a replica as up only when its port has a listener."""

from __future__ import annotations

import socket

from eventfleet_server.fleet.supervisor import reached_a_listener

from e2e.ports import free_port


def test_a_socket_connected_to_itself_is_not_a_listener():
    # What polling a port of the ephemeral range with nothing on it can end in: the
    # kernel hands the connecting socket the target port and it connects to itself.
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.connect(("127.0.0.1", port))  # simultaneous open with itself
        assert s.getsockname() == s.getpeername()
        assert not reached_a_listener(s.getsockname(), s.getpeername())


def test_a_connection_accepted_by_a_listener_is():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as c:
            assert reached_a_listener(c.getsockname(), c.getpeername())

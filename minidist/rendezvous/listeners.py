"""What a node's rendezvous and its agent share: the one TCP port and the Unix socket
they listen on, and the heartbeat between them."""

from __future__ import annotations

import socket

from ..transport import addresses

HEARTBEAT = 1.0  # seconds between heartbeats to and from node agents
HEARTBEAT_TIMEOUT = 5.0  # silence after which a node is declared lost


def bind_listeners(host: str, port: int, job: str | None) -> list[socket.socket]:
    """The node's listening sockets: the agent's Unix socket (if ``job`` is given) and
    the one TCP port. The Unix socket is bound first, so a process that finds the TCP
    port open on its own node also finds the Unix socket."""
    out = []
    if job is not None:
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            u.bind(addresses.agent_address(job))
        except OSError as e:
            u.close()
            raise OSError(e.errno, f"another minidist agent of this job already runs on "
                          f"this node: {e.strerror}") from e
        u.listen(socket.SOMAXCONN)
        out.append(u)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        tcp.bind((host, port))
    except OSError as e:
        tcp.close()
        for s in out:
            s.close()
        raise OSError(e.errno, f"minidist cannot listen on {host}:{port}: {e.strerror}; "
                      "choose another port with MINIDIST_PORT (or --master-port)") from e
    tcp.listen(socket.SOMAXCONN)
    out.append(tcp)
    return out

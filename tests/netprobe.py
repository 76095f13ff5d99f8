"""A target on this machine for "no network" checks: a TCP listener that greets every connection
with a token and counts them. A check dials it from a sandbox that must not reach it, and dials
it the same way from a public sandbox that must, so that an offline host (or a dead listener)
cannot make the check pass.
"""

from __future__ import annotations

import os
import socket
import threading


class Banner:
    def __init__(self, host: str) -> None:
        self.token = f"sg-probe-{os.urandom(4).hex()}"
        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, int(self.sock.getsockname()[1])
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(self.token.encode() + b"\n")

    def probe(self) -> str:
        """A shell command that prints the token when it reaches the listener, else fails."""
        return (
            'python3 -c "import socket; '
            f"s = socket.create_connection(('{self.host}', {self.port}), 3); "
            'print(s.recv(64).decode().strip())"'
        )

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Banner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def default_gateway(route_table: str) -> str:
    """The default gateway in a /proc/net/route dump; read inside a container on Docker's
    bridge, that is the host's end of the bridge (an address of this machine)."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            return socket.inet_ntoa(int(fields[2], 16).to_bytes(4, "little"))
    raise AssertionError(f"no default route in {route_table!r}")

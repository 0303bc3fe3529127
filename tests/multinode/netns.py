"""Emulated hosts: network namespaces joined by veth pairs to a bridge (needs root and
iproute2). Every name is unique to the fixture, and everything is deleted afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid


def can_make_hosts() -> str | None:
    """None if emulated hosts can be made here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "emulated hosts need root (ip netns)"
    if shutil.which("ip") is None:
        return "emulated hosts need iproute2's ip command"
    probe = f"mdprobe{uuid.uuid4().hex[:6]}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns, "ip"] if ns else ["ip"]) + list(args)
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Hosts:
    """``n`` hosts at 10.77.<net>.1 .. n on a private bridge."""

    def __init__(self, n: int) -> None:
        self.id = uuid.uuid4().hex[:6]
        self.switch = f"mdsw{self.id}"
        self.names = [f"mdh{self.id}{i}" for i in range(n)]
        self.net = int(self.id[:2], 16) % 250 + 1
        self.addrs = [f"10.77.{self.net}.{i + 1}" for i in range(n)]
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        subprocess.run(["ip", "netns", "add", self.switch], check=True)
        self._made.append(self.switch)
        _ip("link", "add", "br0", "type", "bridge", ns=self.switch)
        _ip("link", "set", "br0", "up", ns=self.switch)
        for i, (name, addr) in enumerate(zip(self.names, self.addrs)):
            subprocess.run(["ip", "netns", "add", name], check=True)
            self._made.append(name)
            a, b = f"mda{self.id}{i}", f"mdb{self.id}{i}"
            _ip("link", "add", a, "type", "veth", "peer", "name", b)
            _ip("link", "set", a, "netns", name)
            _ip("link", "set", b, "netns", self.switch)
            _ip("addr", "add", f"{addr}/24", "dev", a, ns=name)
            _ip("link", "set", a, "up", ns=name)
            _ip("link", "set", "lo", "up", ns=name)
            _ip("link", "set", b, "master", "br0", ns=self.switch)
            _ip("link", "set", b, "up", ns=self.switch)

    def cut(self, i: int) -> None:
        """Take host ``i``'s link down (its processes keep running, unreachable)."""
        _ip("link", "set", f"mdb{self.id}{i}", "down", ns=self.switch)

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def close(self) -> None:
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

"""Footprint as the operating system sees it (Linux /proc): ports, sockets, fds, memory.

Used by the examples, benchmarks and tests; never by the library itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _tcp_table(pid: int) -> list[tuple[str, str, int, int]]:
    """(local, remote, state, inode) of every TCP socket in ``pid``'s network namespace."""
    rows = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    rows.append((parts[1], parts[2], int(parts[3], 16), int(parts[9])))
        except OSError:
            continue
    return rows


LISTEN = 0x0A
ESTABLISHED = 0x01


def tcp_sockets(pids: Iterable[int]) -> tuple[set[int], list[tuple[int, str, str]]]:
    """(ports listened on by these processes, their established TCP connections as
    (pid, local, remote) in /proc's hex notation)."""
    pids = list(pids)
    ports: set[int] = set()
    conns: list[tuple[int, str, str]] = []
    tables: dict[int, list] = {}
    for pid in pids:
        mine = _socket_inodes(pid)
        if not mine:
            continue
        try:
            ns = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            ns = 0
        if ns not in tables:
            tables[ns] = _tcp_table(pid)
        for local, remote, state, inode in tables[ns]:
            if inode in mine:
                if state == LISTEN:
                    ports.add(int(local.rsplit(":", 1)[1], 16))
                elif state == ESTABLISHED:
                    conns.append((pid, local, remote))
    return ports, conns


def fd_count(pid: int) -> int:
    """Open file descriptors of a process."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def socket_count(pid: int) -> int:
    """Open sockets of a process (every kind)."""
    return len(_socket_inodes(pid))


def memory_kib(pid: int) -> dict[str, int]:
    """Rss, Pss, USS (private) and peak RSS (VmHWM) of a process, in KiB."""
    out = {"rss": 0, "pss": 0, "uss": 0, "hwm": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                value = rest.split()
                if not value:
                    continue
                if key == "Rss":
                    out["rss"] = int(value[0])
                elif key == "Pss":
                    out["pss"] = int(value[0])
                elif key in ("Private_Clean", "Private_Dirty"):
                    out["uss"] += int(value[0])
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    out["hwm"] = int(line.split()[1])
    except OSError:
        pass
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used, in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0

"""Which ranks of a job failed, the failure the others followed (its root cause), the
job's exit code, and the closing lines that say so."""

from __future__ import annotations

import signal
from collections.abc import Callable


class Failures:
    """The ranks that failed, in the order their exits were seen. ``last_line(rank)``
    gives a rank's last line of stderr (to tell a rank that only lost another)."""

    def __init__(self, last_line: Callable[[int], bytes]) -> None:
        self.failed: list[tuple[int, int]] = []  # (rank, code) of ranks that failed
        self._last_line = last_line

    def __len__(self) -> int:
        return len(self.failed)

    def add(self, rank: int, code: int) -> int:
        """Rank ``rank`` exited with ``code`` (not 0); the job's exit code now: its root
        cause's code, 128 + the signal for a rank killed by one."""
        self.failed.append((rank, code))
        # a rank killed by a signal is the root cause of the others' failures: its code
        # is the job's, even when a survivor's exit was seen first
        _, code = self.root_cause()
        return code if code > 0 else 128 - code

    def root_cause(self) -> tuple[int, int]:
        """(rank, exit code) of the failure the others followed: a rank killed by a
        signal, else the first whose last words were not about another rank's loss."""
        killed = [f for f in self.failed if f[1] < 0]
        if killed:
            return killed[0]
        own = [f for f in self.failed if b"PeerLostError" not in self._last_line(f[0])]
        return (own or self.failed)[0]

    def summary(self) -> list[str]:
        """The closing lines of a failed job: who failed first and how, and the rest
        folded into one line (none if no rank failed)."""
        if not self.failed:
            return []
        rank, code = self.root_cause()
        name = signal_name(-code) if code < 0 else None
        how = f"killed by {name}" if name is not None else f"exit code {code}"
        others = sorted({r for r, _ in self.failed if r != rank})
        lines = [f"job failed; first failure: rank {rank} ({how})"]
        last = self._last_line(rank).decode(errors="replace").strip()
        if last:
            lines.append(f"rank {rank}: {last}")
        if others:
            lines.append(f"rank(s) {ranges(others)} then failed too (they lost rank {rank} "
                         "or were stopped)")
        return lines


def signal_name(number: int) -> str | None:
    """The name of signal ``number`` ("SIGKILL"), None if there is no such signal."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return None


def ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0-2,4,6-7"."""
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)

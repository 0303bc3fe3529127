"""How much of /dev/shm a job's ranks hold, read from the operating system (``minidist
run --verbose``): the job's named segments in /dev/shm, and the segments its ranks keep
mapped after their names were removed, each counted once by its inode."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

from .. import segments
from ..segments import SHM_DIR


@dataclass
class ShmUse:
    """Bytes of /dev/shm held (pages given, not the files' sizes) and segments counted."""

    named_bytes: int = 0
    unlinked_bytes: int = 0
    segments: int = 0

    @property
    def total(self) -> int:
        return self.named_bytes + self.unlinked_bytes


def job_shm(job: str, pids: Iterable[int]) -> ShmUse:
    """The /dev/shm that job ``job`` (its key) holds now: its files named
    ``minidist-<job>-*``, and those segments mapped by the processes ``pids`` whose names
    are gone (read through ``/proc/<pid>/map_files``)."""
    use, seen = ShmUse(), set()
    for path in segments.named(f"minidist-{job}-"):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_ino not in seen:
                seen.add(st.st_ino)
                use.named_bytes += st.st_blocks * 512
                use.segments += 1
    mark = f"{SHM_DIR}/minidist-{job}-"
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = [ln for ln in f if mark in ln and ln.rstrip().endswith("(deleted)")]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            inode = int(fields[4])
            if inode in seen:
                continue
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
                seen.add(inode)
                use.unlinked_bytes += st.st_blocks * 512
                use.segments += 1
    return use

"""Setting up a communicator over minidist's rendezvous (its key/value store).

No TCPStore and no port of minidist_native's own: the device records, NCCL's unique id
and the CUDA IPC handles travel as values of the job's store (``minidist.get_store()``),
which the rendezvous serves over the connections every rank already holds. One set-up:

1. every member publishes its :class:`~._records.DeviceRecord` (``.../rec/<group rank>``)
   and reads everyone's; a member that declared itself host-only (``declare_host``)
   counts as a CPU rank without publishing anything;
2. all members run the same :func:`~._records.choose` on the same records;
3. for NCCL, group rank 0 makes the unique id and publishes it (``.../uid``); the others
   read it; for CUDA IPC each member publishes its buffer and event handles
   (``.../ipc/<group rank>``);
4. a member whose set-up fails says so (``.../failed``), so the others stop waiting;
5. each member counts itself done (``.../done``); the last one removes the keys
   (host-only members take no part).

Every wait is bounded by the group's timeout and names the ranks it still waits for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from minidist.errors import DistError, DistTimeoutError

from ._errors import PREFIX
from ._keys import Names, host_declaration
from ._records import DeviceRecord, host_record


class SetupFailed(DistError):
    """Another member's set-up of the communicator failed (its message is included)."""


class Exchange:
    """One member's side of one set-up. ``store`` is a ``minidist.Store`` (or anything
    with its methods); ``ranks`` the group's global ranks, ``me`` this member's group
    rank; ``deadline`` a ``clock()`` time."""

    def __init__(self, store: Any, names: Names, ranks: tuple[int, ...], me: int,
                 deadline: float, what: str, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.store = store
        self.names = names
        self.ranks = tuple(ranks)
        self.n = len(self.ranks)
        self.me = me
        self.deadline = deadline
        self.what = what
        self.clock = clock
        #: members that take part (publish, count themselves done): all but host-only
        self.participants = self.n

    # ------------------------------------------------------------------ helpers

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def _timeout(self, waiting_for: list[int], step: str) -> DistTimeoutError:
        return DistTimeoutError(
            f"{PREFIX}{self.what}: the set-up of the CUDA communicator ({step}) waited "
            f"past its deadline for global ranks {waiting_for}. Every member of a group "
            "must make the group's first CUDA call (or, if it passes CPU tensors, call "
            "minidist_native.declare_host() first)", collective=self.what,
            missing=waiting_for)

    def _wait(self, keys: list[str], slice_s: float) -> bool:
        """Wait up to ``slice_s`` (and the deadline) for ``keys``; False if not all set."""
        t = min(slice_s, self.remaining())
        if t <= 0:
            return bool(self.store.check(keys))
        try:
            self.store.wait(keys, timeout=t)
            return True
        except DistTimeoutError:
            return False

    def check_failed(self) -> None:
        """Raise SetupFailed if a member said its set-up failed."""
        if self.store.check([self.names.failed]):
            raw = self.store.get(self.names.failed, timeout=1.0)
            raise SetupFailed(f"{PREFIX}{self.what}: the set-up of the CUDA communicator "
                              f"failed on another rank: {raw.decode(errors='replace')}")

    def _await(self, key: str, owner: int, step: str) -> bytes:
        """The value of ``key`` (set by global rank ``owner``), watching for failures."""
        slice_s = 0.05
        while not self._wait([key], slice_s):
            self.check_failed()
            if self.remaining() <= 0:
                raise self._timeout([owner], step)
            slice_s = min(slice_s * 2, 1.0)
        return bytes(self.store.get(key, timeout=max(self.remaining(), 1.0)))

    # ------------------------------------------------------------------ records

    def publish(self, record: DeviceRecord) -> None:
        self.store.set(self.names.record(self.me), record.encode())

    def gather(self, mine: DeviceRecord) -> list[DeviceRecord]:
        """Every member's record in group-rank order (``mine`` for this member); host
        declarations stand for members that publish none. DistTimeoutError naming the
        members still unaccounted for at the deadline."""
        got: dict[int, DeviceRecord] = {self.me: mine}
        pending = [i for i in range(self.n) if i != self.me]
        slice_s = 0.05
        while pending:
            still = []
            for i in pending:
                if self.store.check([self.names.record(i)]):
                    got[i] = DeviceRecord.decode(
                        self.store.get(self.names.record(i), timeout=max(self.remaining(),
                                                                         1.0)))
                elif self.store.check([host_declaration(self.ranks[i])]):
                    got[i] = host_record(self.ranks[i])
                else:
                    still.append(i)
            pending = still
            if not pending:
                break
            self.check_failed()
            if self.remaining() <= 0:
                raise self._timeout([self.ranks[i] for i in pending], "device records")
            self._wait([self.names.record(i) for i in pending], slice_s)
            slice_s = min(slice_s * 2, 1.0)
        records = [got[i] for i in range(self.n)]
        self.participants = sum(1 for r in records if r.kind == "cuda")
        return records

    # ------------------------------------------------------------------ NCCL's unique id

    def share_uid(self, make: Callable[[], bytes]) -> bytes:
        """NCCL's unique id: made by group rank 0 (``make()``) and published; read by the
        others from the store."""
        if self.me == 0:
            try:
                uid = make()
            except BaseException as e:
                self.fail(f"global rank {self.ranks[0]} could not make NCCL's unique id: {e}")
                raise
            self.store.set(self.names.uid, uid)
            return uid
        return self._await(self.names.uid, self.ranks[0], "NCCL unique id")

    # ------------------------------------------------------------------ CUDA IPC handles

    def share_blobs(self, mine: bytes) -> list[bytes]:
        """Every member's ``mine`` (IPC handles), in group-rank order."""
        self.store.set(self.names.ipc(self.me), mine)
        out = []
        for i in range(self.n):
            out.append(mine if i == self.me else
                       self._await(self.names.ipc(i), self.ranks[i], "CUDA IPC handles"))
        return out

    # ------------------------------------------------------------------ endings

    def fail(self, message: str) -> None:
        """Tell the other members that this member's set-up failed (best effort)."""
        try:
            self.store.set(self.names.failed,
                           f"global rank {self.ranks[self.me]}: {message}".encode())
        except Exception:  # noqa: BLE001 - the rendezvous may be gone too
            pass

    def finish(self) -> None:
        """Count this member done; the last one removes the set-up's keys."""
        try:
            if self.store.add(self.names.done, 1) >= self.participants:
                for key in self.names.every(self.n):
                    self.store.delete_key(key)
        except DistError:
            pass  # the keys stay; nothing depends on their removal

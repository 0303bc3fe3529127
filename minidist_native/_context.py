"""One minidist session's CUDA state: its communicators, made lazily and cached.

A :class:`Context` belongs to one door of minidist (one ``init``); a new ``init`` gets a
new context and the old one's communicators are aborted. Each (group, device) gets its
path on the group's first CUDA call (:meth:`Context.path`): the members exchange device
records over the rendezvous, all choose the same path, and set it up (NCCL
communicator, CUDA IPC slots, or nothing for host staging). A path whose call failed
is never used again: later calls on it raise at once.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import minidist
from minidist.errors import DistError, DistTimeoutError

from ._errors import PREFIX, unusable
from ._exchange import Exchange
from ._keys import CommKey, Ordinals, host_declaration
from ._liveness import PeerWatch
from ._records import Choice, DeviceRecord, choose
from ._watchdog import watchdog

FORCE_VAR = "MINIDIST_NATIVE_PATH"


# ---------------------------------------------------------------------- who we are


def machine_id() -> str:
    """This OS instance: host name and boot id (CUDA IPC works within one)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def device_uuid(index: int) -> str:
    """The GPU's UUID (its PCI address where torch does not report one)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    u = getattr(p, "uuid", None)
    if u is not None:
        return str(u)
    return (f"pci-{getattr(p, 'pci_domain_id', 0)}-{getattr(p, 'pci_bus_id', '?')}-"
            f"{getattr(p, 'pci_device_id', '?')}")


def local_record(rank: int, node: int, device: int) -> DeviceRecord:
    """This process's record for a communicator on ``cuda:<device>``."""
    import torch

    from ._availability import available

    av = available()
    visible = tuple(device_uuid(i) for i in range(torch.cuda.device_count()))
    return DeviceRecord(rank=rank, kind="cuda", node=node, machine=machine_id(),
                        uuid=device_uuid(device), index=device,
                        nccl=(av.nccl or "") if av.ok else "", binding=av.binding or "",
                        ipc=av.ipc, force=os.environ.get(FORCE_VAR, "").strip().lower(),
                        visible=visible)


class _EventPending:
    """The end of a call that has no communicator to abort (CUDA IPC)."""

    def __init__(self, event: Any, deadline: float, what: str, timeout: float) -> None:
        self.event = event
        self.deadline = deadline
        self.what = what
        self.timeout = timeout
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def poll(self, now: float) -> tuple[bool, BaseException | None]:
        if self.event.query():
            return True, None
        if now > self.deadline:
            return True, DistTimeoutError(f"{PREFIX}{self.what} did not finish on the GPU "
                                          f"within {self.timeout:g} s", collective=self.what)
        return False, None


def event_future(device: Any, timeout: float, what: str) -> concurrent.futures.Future:
    """A future completed when the work issued so far on ``device``'s current stream is
    done (failed with DistTimeoutError past ``timeout``)."""
    import torch

    from ._comm import current_stream

    ev = torch.cuda.Event()
    ev.record(current_stream(device.index))
    return watchdog().defer(_EventPending(ev, time.monotonic() + timeout, what, timeout))


# ---------------------------------------------------------------------- the context


class Context:
    def __init__(self, door: Any) -> None:
        self.door = door
        self.store = minidist.Store(door)
        self.paths: dict[CommKey, Any] = {}
        #: (group id, ranks, device) -> (its CommKey, this rank's index): made once
        self.keys: dict[tuple[int, tuple[int, ...], int], tuple[CommKey, int]] = {}
        self.choices: dict[CommKey, Choice] = {}
        self.broken: dict[CommKey, BaseException] = {}
        self.ordinals = Ordinals()
        self.watch = PeerWatch(door)
        self.lock = threading.RLock()
        self._undeclared = False
        self.closed = False

    # ------------------------------------------------------------------ paths

    def path(self, key: CommKey, group: Any, ranks: tuple[int, ...], me: int,
             what: str) -> Any:
        """The path of ``key`` (set up on first use). ``group`` is the minidist group
        (None: the world), ``ranks`` the communicator's global ranks, ``me`` this
        process's index in them."""
        p = self.paths.get(key)
        if p is not None and not self.closed and getattr(p, "failure", None) is None \
                and key not in self.broken:
            return p
        with self.lock:
            if self.closed:
                raise DistError(f"{PREFIX}{what}: minidist_native was shut down")
            if key in self.broken:
                raise unusable(self.broken[key], what)
            p = self.paths.get(key)
            if p is not None:
                failure = getattr(p, "failure", None)
                if failure is not None:
                    self.broken[key] = failure
                    raise unusable(failure, what)
                return p
            try:
                p = self._setup(key, group, ranks, me, what)
            except BaseException as e:
                self.broken[key] = e
                raise
            self.paths[key] = p
            return p

    def run(self, key: CommKey, group: Any, ranks: tuple[int, ...], me: int, what: str,
            call: Callable[[Any], concurrent.futures.Future]) -> concurrent.futures.Future:
        """``call(path)`` on ``key``'s path; a DistError breaks the path for good (as a
        failed collective breaks a minidist group)."""
        p = self.path(key, group, ranks, me, what)
        try:
            fut = call(p)
        except DistError as e:
            with self.lock:
                self.broken.setdefault(key, e)
            raise
        fut.add_done_callback(lambda f: self._outcome(key, f))
        return fut

    def _outcome(self, key: CommKey, f: concurrent.futures.Future) -> None:
        if not f.cancelled() and isinstance(f.exception(), DistError):
            with self.lock:
                self.broken.setdefault(key, f.exception())

    def _undeclare_host(self) -> None:
        """A rank that makes CUDA calls is no host-only rank (a declaration left from an
        earlier run of the job would mislead the others)."""
        if not self._undeclared:
            self._undeclared = True
            try:
                self.store.delete_key(host_declaration(self.door.rank))
            except DistError:
                pass

    def _setup(self, key: CommKey, group: Any, ranks: tuple[int, ...], me: int,
               what: str) -> Any:
        timeout = self.door.timeout_of(group)
        deadline = time.monotonic() + timeout
        names = self.ordinals.next(key)
        ex = Exchange(self.store, names, ranks, me, deadline, f"{what} on {key}")
        self._undeclare_host()
        try:
            mine = local_record(self.door.rank, self.door.node_rank, key.device)
            ex.publish(mine)
            records = ex.gather(mine)
            choice = choose(records)
            if key.pair and (choice.path == "ipc" or
                             (choice.path == "nccl" and mine.binding != "ctypes")):
                choice = Choice("host", f"host staging for point-to-point ({choice.reason})",
                                choice.shared)
            if choice.path == "nccl":
                p = self._nccl(key, group, ranks, me, timeout, deadline, ex)
            elif choice.path == "ipc":
                p = self._ipc(key, group, ranks, me, timeout, ex)
            else:
                from ._host import HostPath

                p = HostPath(group, ranks)
        except BaseException as e:
            if not isinstance(e, DistTimeoutError):
                ex.fail(f"{type(e).__name__}: {e}")
            raise
        ex.finish()
        self.choices[key] = choice
        return p

    def _nccl(self, key: CommKey, group: Any, ranks: tuple[int, ...], me: int,
              timeout: float, deadline: float, ex: Exchange) -> Any:
        from . import _nccl as N
        from ._availability import available
        from ._comm import NcclComm, TorchNcclComm

        av = available()
        if av.binding == "ctypes":
            lib, _ = N.load()
            comm: Any = NcclComm(lib, key, group, ranks, me, key.device, timeout)
            make = lib.get_unique_id
        else:
            import torch.cuda.nccl as tn

            comm = TorchNcclComm(key, group, ranks, me, key.device, timeout)
            make = tn.unique_id
        self.watch.watch([r for r in ranks if r != self.door.rank], comm.peer_lost)
        uid = ex.share_uid(make)
        comm.init(uid, deadline, ex.check_failed)
        return comm

    def _ipc(self, key: CommKey, group: Any, ranks: tuple[int, ...], me: int,
             timeout: float, ex: Exchange) -> Any:
        import torch

        from ._ipc import INITIAL_CAPACITY, CudaSlots, IpcPath, regrow, slot_capacity

        cap = slot_capacity()
        slots = CudaSlots(key.device, min(cap, INITIAL_CAPACITY), device_uuid)
        slots.attach(ex.share_blobs(slots.export()), me)
        device = torch.device("cuda", key.device)
        what = f"CUDA IPC call on {key}"

        def grow(capacity: int) -> Any:
            # this process's reads of the old slots end before it shares the new ones,
            # and it frees its old slots only once every member has shared: so nobody
            # still reads a slot that is freed
            torch.cuda.synchronize(device)
            grown = Exchange(self.store, self.ordinals.next(key), ranks, me,
                             time.monotonic() + timeout, f"growing the CUDA IPC slots of {key}")
            try:
                new = regrow(path.slots, lambda c: CudaSlots(key.device, c, device_uuid),
                             grown.share_blobs, capacity, me)
            except BaseException as e:
                if not isinstance(e, DistTimeoutError):
                    grown.fail(f"{type(e).__name__}: {e}")
                raise
            grown.finish()
            return new

        path = IpcPath(slots, me, len(ranks), lambda: minidist.barrier(group), device,
                       completion=lambda: event_future(device, timeout, what),
                       grow=grow, cap=cap)
        return path

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            paths, self.paths = list(self.paths.values()), {}
        self.watch.close()
        for p in paths:
            try:
                p.close()
            except Exception:  # noqa: BLE001 - closing what is left, best effort
                pass

    def describe(self) -> list[dict[str, Any]]:
        with self.lock:
            out = []
            for key, p in self.paths.items():
                c = self.choices.get(key)
                out.append({"key": str(key), "path": p.name,
                            "binding": getattr(p, "binding", None),
                            "reason": c.reason if c else "",
                            "failed": key in self.broken})
            return out


_ctx: Context | None = None
_ctx_lock = threading.Lock()


def context() -> Context:
    """The context of minidist's current session (DistError if minidist is not
    initialized); a new session replaces (and closes) the old one's."""
    global _ctx
    d = minidist.api.door()
    with _ctx_lock:
        old = None
        if _ctx is None or _ctx.door is not d:
            old, _ctx = _ctx, Context(d)
        ctx = _ctx
    if old is not None:
        old.close()
    return ctx


def current() -> Context | None:
    return _ctx


def shutdown() -> None:
    """Abort every communicator of this process and free the IPC buffers (also at exit,
    and when minidist is initialized again)."""
    global _ctx
    with _ctx_lock:
        old, _ctx = _ctx, None
    if old is not None:
        old.close()


def _after_fork() -> None:
    global _ctx, _ctx_lock
    _ctx = None
    _ctx_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)

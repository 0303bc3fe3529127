"""CUDA IPC: the collectives of ranks that share a GPU (NCCL refuses them), reduced on
the GPU.

Set-up: each member allocates one exchange buffer of two slots on its device and six
interprocess CUDA events (per slot: *written*, *reduced*, *read*), and publishes their
IPC handles through the rendezvous; every member opens the others'. A call then moves
its tensor through the slots in chunks, all GPU work on the caller's current stream:

1. wait until the peers have finished *reading* this slot (its previous use), copy the
   chunk in, record *written*;
2. a host barrier over minidist (the group's own barrier: it also turns a lost peer or
   a deadline into an error), after which every peer's *written* event is recorded;
3. make the stream wait on the peers' *written* events, then read the peers' slots and
   reduce on the GPU (all_reduce of larger chunks first reduce-scatters through the
   slots, *reduced*, a second barrier, then gathers), and record *read*.

Slots start small and grow to fit the calls (up to ``MINIDIST_NATIVE_IPC_SLOT_MB``): a
call of a size every member shares makes all of them grow together, through the
rendezvous, so that a large tensor crosses in one chunk. Each chunk costs the ranks
that share a GPU a switch between their CUDA contexts, which costs more than moving
the bytes.

Slots alternate, so the barrier of the next chunk is what proves that the peers have
recorded the *read* event the chunk after that waits on: one or two barriers per
chunk, and the host never waits for the GPU. Every rank reduces in the same rank
order, so all get identical bits; 16-bit floats accumulate in float32.

The same algorithm runs over host shared memory (:class:`HostSlots`, events are not
needed there), which is how it is tested on machines without a GPU.
"""

from __future__ import annotations

import concurrent.futures
import io
import mmap
import os
import pickle
import secrets
from collections.abc import Callable
from typing import Any, Protocol

import torch

from minidist import segments
from minidist.ops import ReduceOp

from ._dtypes import reduce_into

WRITTEN, REDUCED, READ = 0, 1, 2

#: the largest slot, in bytes, unless MINIDIST_NATIVE_IPC_SLOT_MB says otherwise
DEFAULT_CAPACITY = 256 << 20
#: the slots' size at set-up (or the largest, if smaller)
INITIAL_CAPACITY = 4 << 20
#: below this many bytes per chunk, all_reduce reads every peer's whole chunk (one
#: barrier); above, it reduce-scatters then gathers (two barriers, 2x the bytes read
#: instead of n x)
TWO_PHASE_BYTES = 256 << 10


def slot_capacity(environ: dict | None = None) -> int:
    """The largest slot in bytes: ``MINIDIST_NATIVE_IPC_SLOT_MB`` (MiB, > 0) or 256 MiB."""
    env = os.environ if environ is None else environ
    raw = env.get("MINIDIST_NATIVE_IPC_SLOT_MB", "")
    if not raw:
        return DEFAULT_CAPACITY
    mb = float(raw)
    if mb <= 0:
        raise ValueError(f"MINIDIST_NATIVE_IPC_SLOT_MB must be > 0, not {raw!r}")
    return max(4096, int(mb * (1 << 20)) // 256 * 256)


class Slots(Protocol):
    """The exchange buffers of a group: two slots of ``capacity`` bytes per member."""

    capacity: int
    n: int
    me: int

    def slot(self, member: int, s: int) -> torch.Tensor:
        """Member ``member``'s slot ``s``: a uint8 tensor of ``capacity`` bytes."""
        ...

    def mark(self, s: int, stage: int) -> None:
        """This member's work on slot ``s`` has reached ``stage`` (an event record)."""
        ...

    def wait(self, members: list[int], s: int, stage: int) -> None:
        """Later work of this member waits until ``members`` reached ``stage`` on their
        slot ``s`` (stream waits on their events)."""
        ...

    def done(self) -> concurrent.futures.Future | None:
        """A future for the work issued so far (None: it is done already)."""
        ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------- host slots


class HostSlots:
    """Slots in host shared memory (files in /dev/shm, unlinked once every member has
    mapped them). CPU work is synchronous, so marks and waits are no-ops."""

    def __init__(self, capacity: int, hint: str = "") -> None:
        self.capacity = capacity
        self.path = (f"/dev/shm/minidist-native-{hint}{os.getpid()}-"
                     f"{secrets.token_hex(4)}")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:  # every page reserved now: /dev/shm too small is an error here, not SIGBUS
            os.ftruncate(fd, 2 * capacity)
            segments.reserve(fd, 0, 2 * capacity, "host slots")
            self._maps = [mmap.mmap(fd, 2 * capacity)]
        except BaseException:
            self.unlink()
            raise
        finally:
            os.close(fd)
        self._bufs: list[torch.Tensor] = []
        self.n = 1
        self.me = 0

    def export(self) -> bytes:
        return self.path.encode()

    def attach(self, blobs: list[bytes], me: int) -> None:
        own = torch.frombuffer(self._maps[0], dtype=torch.uint8)
        self.n, self.me = len(blobs), me
        for i, blob in enumerate(blobs):
            if i == me:
                self._bufs.append(own)
                continue
            fd = os.open(blob.decode(), os.O_RDWR)
            try:
                m = mmap.mmap(fd, 2 * self.capacity)
            finally:
                os.close(fd)
            self._maps.append(m)
            self._bufs.append(torch.frombuffer(m, dtype=torch.uint8))

    def unlink(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def slot(self, member: int, s: int) -> torch.Tensor:
        return self._bufs[member][s * self.capacity:(s + 1) * self.capacity]

    def mark(self, s: int, stage: int) -> None:
        pass

    def wait(self, members: list[int], s: int, stage: int) -> None:
        pass

    def done(self) -> concurrent.futures.Future | None:
        return None

    def close(self) -> None:
        self.unlink()
        self._bufs = []


# ---------------------------------------------------------------------- CUDA slots


class _HandleUnpickler(pickle.Unpickler):
    """Unpickles torch's CUDA IPC handles (``reduce_tensor``'s output) and nothing else:
    values come from the rendezvous' store, so only the names they need resolve."""

    _ALLOWED = {
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
        ("torch", "Tensor"), ("torch", "Size"), ("torch", "UntypedStorage"),
        ("torch", "TypedStorage"), ("torch.storage", "UntypedStorage"),
        ("torch.storage", "TypedStorage"), ("torch.nn.parameter", "Parameter"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"minidist_native: refusing {module}.{name} in a "
                                     "CUDA IPC handle")


def load_handles(blob: bytes) -> Any:
    return _HandleUnpickler(io.BytesIO(blob)).load()


def _local_index(uuid_of: Callable[[int], str], uuid: str, fallback: int) -> int:
    for i in range(torch.cuda.device_count()):
        if uuid_of(i) == uuid:
            return i
    return fallback


class CudaSlots:
    """Slots in GPU memory, shared through CUDA IPC (torch's own handles), ordered by
    interprocess CUDA events. Needs a GPU (not run on CPU-only machines)."""

    def __init__(self, device: int, capacity: int, uuid_of: Callable[[int], str]) -> None:
        self.capacity = capacity
        self.device = torch.device("cuda", device)
        self.uuid_of = uuid_of
        with torch.cuda.device(self.device):
            self.buf = torch.empty(2 * capacity, dtype=torch.uint8, device=self.device)
            self.events = [[torch.cuda.Event(interprocess=True) for _ in range(3)]
                           for _ in range(2)]
            stream = torch.cuda.current_stream(self.device)
            for row in self.events:
                for ev in row:
                    ev.record(stream)
        self._bufs: list[torch.Tensor] = []
        self._peer_events: list[list[list[Any]]] = []
        self.n = 1
        self.me = 0

    def export(self) -> bytes:
        from torch.multiprocessing.reductions import reduce_tensor

        fn, args = reduce_tensor(self.buf)
        handles = [[ev.ipc_handle() for ev in row] for row in self.events]
        return pickle.dumps((fn, args, handles, self.uuid_of(self.device.index)))

    def attach(self, blobs: list[bytes], me: int) -> None:
        import inspect

        self.n, self.me = len(blobs), me
        for i, blob in enumerate(blobs):
            if i == me:
                self._bufs.append(self.buf)
                self._peer_events.append(self.events)
                continue
            fn, args, handles, uuid = load_handles(blob)
            index = _local_index(self.uuid_of, uuid, self.device.index)
            args = list(args)
            try:  # the producer's device index is in its own numbering: use ours
                pos = list(inspect.signature(fn).parameters).index("storage_device")
                args[pos] = index
            except (ValueError, TypeError):
                pass
            with torch.cuda.device(index):
                self._bufs.append(fn(*args))
                dev = torch.device("cuda", index)
                self._peer_events.append([[torch.cuda.Event.from_ipc_handle(dev, h)
                                           for h in row] for row in handles])

    def unlink(self) -> None:
        pass

    def slot(self, member: int, s: int) -> torch.Tensor:
        return self._bufs[member][s * self.capacity:(s + 1) * self.capacity]

    def mark(self, s: int, stage: int) -> None:
        self.events[s][stage].record(torch.cuda.current_stream(self.device))

    def wait(self, members: list[int], s: int, stage: int) -> None:
        stream = torch.cuda.current_stream(self.device)
        for m in members:
            if m != self.me:
                stream.wait_event(self._peer_events[m][s][stage])

    def done(self) -> concurrent.futures.Future | None:
        return None  # the caller records its own completion event

    def close(self) -> None:
        self._bufs = []
        self._peer_events = []


# ---------------------------------------------------------------------- the algorithm


def _view(raw: torch.Tensor, dtype: torch.dtype, count: int, start: int = 0
          ) -> torch.Tensor:
    width = torch.empty(0, dtype=dtype).element_size()
    return raw[start * width:(start + count) * width].view(dtype)


def _segments(count: int, n: int) -> list[tuple[int, int]]:
    base, extra = divmod(count, n)
    out, lo = [], 0
    for i in range(n):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def dense(t: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """(a flat contiguous tensor with ``t``'s values, a step that copies it back into
    ``t`` when ``t`` itself is not contiguous, else None)."""
    d = t.detach()
    if d.is_contiguous() and not d.is_conj() and not d.is_neg():
        return d.reshape(-1), None
    flat = d.resolve_conj().resolve_neg().contiguous().reshape(-1)

    def post() -> None:
        d.copy_(flat.view(d.shape))

    return flat, post


def grown_capacity(current: int, needed: int, cap: int) -> int:
    """The slot size that a call of ``needed`` bytes per slot grows ``current`` to
    (``current`` itself when it fits or the cap is reached): a power of two times
    ``current``, at most ``cap``."""
    if needed <= current or current >= cap:
        return current
    new = current
    while new < needed:
        new *= 2
    return min(new, cap)


def regrow(old: Slots, make: Callable[[int], Slots],
           share: Callable[[bytes], list[bytes]], capacity: int, me: int) -> Slots:
    """New slots of ``capacity`` bytes for every member: made, their handles shared
    (``share`` is a rendezvous of the group's members, after which no member reads
    the old slots), attached; the old ones closed."""
    new = make(capacity)
    try:
        new.attach(share(new.export()), me)
    except BaseException:
        new.close()
        raise
    old.close()
    return new


class IpcPath:
    """The collectives of one group over :class:`Slots`. ``me`` is this member's group
    rank, roots are group ranks; ``barrier()`` is the group's host barrier.
    ``grow(capacity)``, where given, returns the group's new, larger slots (a
    collective: every member calls it at the same call); ``cap`` bounds their size."""

    name = "ipc"

    def __init__(self, slots: Slots, me: int, n: int, barrier: Callable[[], None],
                 device: torch.device | None = None,
                 completion: Callable[[], concurrent.futures.Future] | None = None,
                 grow: Callable[[int], Slots] | None = None, cap: int = 0) -> None:
        self.slots = slots
        self._grow = grow
        self.cap = cap or slots.capacity
        self.grown = 0  # times the slots grew
        self.me = me
        self.n = n
        self.others = [i for i in range(n) if i != me]
        self._barrier = barrier
        self._next = 0
        self.device = device
        self._completion = completion
        self.chunks = 0  # chunks moved (for tests and stats)
        self.two_phase = 0  # all_reduce chunks that reduce-scattered, then gathered

    def _fit(self, nbytes: int) -> None:
        """Grow the slots (every member does, at the same call) so that ``nbytes`` fit
        in one chunk, as far as the cap allows."""
        if self._grow is None:
            return
        new = grown_capacity(self.slots.capacity, nbytes, self.cap)
        if new != self.slots.capacity:
            self.slots = self._grow(new)
            self._next = 0
            self.grown += 1

    def _slot(self) -> int:
        s = self._next
        self._next ^= 1
        self.chunks += 1
        return s

    def _per(self, dtype: torch.dtype, blocks: int = 1) -> int:
        width = torch.empty(0, dtype=dtype).element_size()
        per = self.slots.capacity // (width * blocks)
        if per < 1:
            raise ValueError(f"CUDA IPC slots of {self.slots.capacity} bytes cannot hold "
                             f"{blocks} elements of {dtype}")
        return per

    def _peer(self, i: int, s: int, dtype: torch.dtype, count: int, start: int = 0
              ) -> torch.Tensor:
        v = _view(self.slots.slot(i, s), dtype, count, start)
        if self.device is not None and v.device != self.device:
            v = v.to(self.device)
        return v

    def _finish(self, post: Callable[[], None] | None) -> concurrent.futures.Future:
        if post is not None:
            post()
        if self._completion is not None:
            return self._completion()
        f: concurrent.futures.Future = concurrent.futures.Future()
        f.set_result(None)
        return f

    # ------------------------------------------------------------------ collectives

    def all_reduce(self, t: torch.Tensor, op: ReduceOp) -> concurrent.futures.Future:
        flat, post = dense(t)
        dt = flat.dtype
        self._fit(flat.numel() * flat.element_size())
        per = self._per(dt)
        width = flat.element_size()
        for a in range(0, flat.numel(), per):
            b = min(flat.numel(), a + per)
            cnt = b - a
            s = self._slot()
            self.slots.wait(self.others, s, READ)
            _view(self.slots.slot(self.me, s), dt, cnt).copy_(flat[a:b])
            self.slots.mark(s, WRITTEN)
            self._barrier()
            self.slots.wait(self.others, s, WRITTEN)
            if self.n > 2 and cnt * width > TWO_PHASE_BYTES and cnt >= self.n:
                self.two_phase += 1
                seg = _segments(cnt, self.n)
                lo, hi = seg[self.me]
                parts = [self._peer(i, s, dt, hi - lo, lo) for i in range(self.n)]
                reduce_into(_view(self.slots.slot(self.me, s), dt, hi - lo, lo), parts, op)
                self.slots.mark(s, REDUCED)
                self._barrier()
                self.slots.wait(self.others, s, REDUCED)
                for i, (lo_i, hi_i) in enumerate(seg):
                    flat[a + lo_i:a + hi_i].copy_(self._peer(i, s, dt, hi_i - lo_i, lo_i))
            else:
                parts = [self._peer(i, s, dt, cnt) for i in range(self.n)]
                reduce_into(flat[a:b], parts, op)
            self.slots.mark(s, READ)
        return self._finish(post)

    def broadcast(self, t: torch.Tensor, root: int) -> concurrent.futures.Future:
        flat, post = dense(t)
        raw = flat.view(torch.uint8) if flat.numel() else flat
        self._fit(raw.numel())
        per = self._per(torch.uint8)
        for a in range(0, raw.numel(), per):
            b = min(raw.numel(), a + per)
            s = self._slot()
            self.slots.wait(self.others, s, READ)
            if self.me == root:
                self.slots.slot(self.me, s)[:b - a].copy_(raw[a:b])
                self.slots.mark(s, WRITTEN)
            self._barrier()
            if self.me != root:
                self.slots.wait([root], s, WRITTEN)
                raw[a:b].copy_(self._peer(root, s, torch.uint8, b - a))
            self.slots.mark(s, READ)
        return self._finish(post if self.me != root else None)

    def reduce(self, t: torch.Tensor, op: ReduceOp, root: int) -> concurrent.futures.Future:
        flat, post = dense(t)
        dt = flat.dtype
        self._fit(flat.numel() * flat.element_size())
        per = self._per(dt)
        for a in range(0, flat.numel(), per):
            b = min(flat.numel(), a + per)
            cnt = b - a
            s = self._slot()
            self.slots.wait(self.others, s, READ)
            _view(self.slots.slot(self.me, s), dt, cnt).copy_(flat[a:b])
            self.slots.mark(s, WRITTEN)
            self._barrier()
            if self.me == root:
                self.slots.wait(self.others, s, WRITTEN)
                parts = [self._peer(i, s, dt, cnt) for i in range(self.n)]
                reduce_into(flat[a:b], parts, op)
            self.slots.mark(s, READ)
        return self._finish(post if self.me == root else None)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> concurrent.futures.Future:
        src, _ = dense(inp)
        dst, post = dense(out)
        m = src.numel()
        if dst.numel() != m * self.n:
            raise ValueError(f"all_gather: the output has {dst.numel()} elements, not "
                             f"{m} x {self.n}")
        raw_in = src.view(torch.uint8) if m else src
        raw_out = dst.view(torch.uint8) if m else dst
        mb = raw_in.numel()
        self._fit(mb)
        per = self._per(torch.uint8)
        for a in range(0, mb, per):
            b = min(mb, a + per)
            s = self._slot()
            self.slots.wait(self.others, s, READ)
            self.slots.slot(self.me, s)[:b - a].copy_(raw_in[a:b])
            self.slots.mark(s, WRITTEN)
            self._barrier()
            self.slots.wait(self.others, s, WRITTEN)
            for i in range(self.n):
                raw_out[i * mb + a:i * mb + b].copy_(self._peer(i, s, torch.uint8, b - a))
            self.slots.mark(s, READ)
        return self._finish(post)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor,
                       op: ReduceOp) -> concurrent.futures.Future:
        src, _ = dense(inp)
        dst, post = dense(out)
        m = dst.numel()
        if src.numel() != m * self.n:
            raise ValueError(f"reduce_scatter: the input has {src.numel()} elements, not "
                             f"{m} x {self.n}")
        dt = src.dtype
        self._fit(src.numel() * src.element_size())
        per = self._per(dt, self.n)
        for a in range(0, m, per):
            b = min(m, a + per)
            cnt = b - a
            s = self._slot()
            self.slots.wait(self.others, s, READ)
            mine = _view(self.slots.slot(self.me, s), dt, cnt * self.n)
            mine.view(self.n, cnt).copy_(src.view(self.n, m)[:, a:b])
            self.slots.mark(s, WRITTEN)
            self._barrier()
            self.slots.wait(self.others, s, WRITTEN)
            parts = [self._peer(i, s, dt, cnt, self.me * cnt) for i in range(self.n)]
            reduce_into(dst[a:b], parts, op)
            self.slots.mark(s, READ)
        return self._finish(post)

    def close(self) -> None:
        self.slots.close()

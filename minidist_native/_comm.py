"""NCCL communicators: one per (group, device), over the ctypes binding of libnccl
(:class:`NcclComm`) or, where no libnccl can be opened, over torch's own bindings
(:class:`TorchNcclComm`, ``torch.cuda.nccl``, with their limits worked around).

Both take a call's tensors on the caller's current CUDA stream and return a future that
the watchdog completes when the GPU is done with the call, or fails:

* ncclCommGetAsyncError reports an error: the communicator is aborted, the future
  fails with the mapped minidist error;
* a peer is lost or leaves (minidist's rendezvous says so): aborted, PeerLostError;
* the group's deadline passes: aborted, DistTimeoutError.

ncclCommAbort releases the kernels a dead peer would otherwise block forever. A
communicator that failed stays failed: every later call on it raises at once, as a
minidist group does after a failed collective.

Ops that NCCL lacks are lowered (:mod:`._dtypes`): bool, complex, int16, and the
bitwise reductions (gathered, then reduced on the GPU).
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from minidist.errors import DistError, DistTimeoutError, PeerLostError
from minidist.ops import ReduceOp

from . import _nccl as N
from ._dtypes import as_lowered, lower, reduce_into
from ._errors import IN_PROGRESS, PREFIX, SUCCESS, unusable
from ._ipc import dense
from ._watchdog import watchdog

#: seconds a call in flight may still take after a peer left normally
DEPARTURE_GRACE = 2.0


_streams: dict[tuple[int, int, int], Any] = {}


def current_stream(index: int) -> Any:
    """The current CUDA stream of device ``index`` (torch.cuda.current_stream's, with
    its Python object made once per stream)."""
    get = getattr(torch._C, "_cuda_getCurrentStream", None)
    if get is None:
        return torch.cuda.current_stream(index)
    sid = tuple(get(index))
    s = _streams.get(sid)
    if s is None:
        s = _streams[sid] = torch.cuda.Stream(stream_id=sid[0], device_index=sid[1],
                                              device_type=sid[2])
    return s


class Failed(DistError):
    """Raised into calls of a communicator that failed earlier (see :func:`unusable`)."""


class _Pending:
    """One call in flight, watched by the watchdog."""

    def __init__(self, comm: _Base, event: Any, deadline: float, what: str,
                 keep: list) -> None:
        self.comm = comm
        self.event = event
        self.deadline = deadline
        self.what = what
        self.keep = keep  # tensors the GPU still uses: alive until it is done
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.departed_seen: float | None = None

    def poll(self, now: float) -> tuple[bool, BaseException | None]:
        err = self.comm.failure
        if err is not None:  # aborted: an aborted kernel also completes its event
            return True, err
        if self.event.query():
            return True, None
        err = self.comm.check_async(self.what)
        gone = self.comm.departed
        if err is None and gone is not None:
            # a peer left normally: what it took part in completes soon, or never will
            if self.departed_seen is None:
                self.departed_seen = now
            elif now - self.departed_seen > DEPARTURE_GRACE:
                err = gone
        if err is None and now > self.deadline:
            err = DistTimeoutError(
                f"{PREFIX}{self.what} on {self.comm.key} did not finish on the GPU within "
                f"{self.comm.timeout:g} s; its NCCL communicator was aborted",
                collective=self.what, group=self.comm.group)
        if err is not None:
            self.comm.abort(err)
            return True, self.comm.failure or err
        return False, None


class _Base:
    """What both bindings share: state, failure, the watchdog, the lowerings."""

    name = "nccl"

    def __init__(self, key: Any, group: Any, ranks: tuple[int, ...], me: int, device: int,
                 timeout: float) -> None:
        self.key = key
        self.group = group
        self.ranks = tuple(ranks)
        self.n = len(self.ranks)
        self.me = me
        self.device = torch.device("cuda", device)
        self.index = device
        self.timeout = timeout
        self.failure: BaseException | None = None
        #: a peer that left normally (not an error yet: see _Pending.poll)
        self.departed: BaseException | None = None
        #: held while a call is issued (NCCL needs every rank to enqueue in one order)
        self._lock = threading.RLock()
        #: held around each single library call and the abort (never while waiting), so
        #: an abort from another thread never frees the communicator under a call
        self._nccl = threading.RLock()

    # ------------------------------------------------------------------ state

    def peer_lost(self, peer: int, error: BaseException) -> None:
        """minidist says global rank ``peer`` is gone. Called on minidist's loop thread,
        which must not wait for ncclCommAbort: the abort runs on a thread of its own. A
        peer that died aborts the communicator at once; one that left normally (the end
        of a job) lets the calls in flight finish (see _Pending.poll), and fails later
        calls."""
        left = bool(getattr(error, "left", False))
        err = PeerLostError(f"{PREFIX}NCCL communicator of {self.key}: {error}",
                            ranks=getattr(error, "ranks", (peer,)) or (peer,),
                            left=left, group=self.group)
        if left:
            if self.departed is None:
                self.departed = err
            return
        threading.Thread(target=self.abort, args=(err,), daemon=True,
                         name="minidist-native-abort").start()

    def check_async(self, what: str) -> BaseException | None:
        return None

    def _solo(self, op: ReduceOp) -> ReduceOp:
        """AVG over a communicator of one rank is SUM: the values themselves. (NCCL
        2.28's ncclAvg on one rank returned wrong values for large out-of-place
        reduce_scatter on an H200.)"""
        return ReduceOp.SUM if self.n == 1 and op == ReduceOp.AVG else op

    def abort(self, error: BaseException) -> None:
        """Fail the communicator with ``error`` (the first one stays) and abort it."""
        with self._nccl:
            if self.failure is None:
                self.failure = error
                self._abort()

    def _abort(self) -> None:
        pass

    def close(self) -> None:
        self.abort(DistError(f"{PREFIX}the communicator of {self.key} was closed"))

    def _usable(self, what: str) -> None:
        if self.failure is None and self.departed is not None:
            self.abort(self.departed)  # nothing can complete with a departed peer
        if self.failure is not None:
            raise unusable(self.failure, what)

    def _stream(self) -> Any:
        return current_stream(self.index)

    def _watch(self, what: str, keep: list) -> concurrent.futures.Future:
        ev = torch.cuda.Event()
        ev.record(self._stream())
        item = _Pending(self, ev, time.monotonic() + self.timeout, what, keep)
        return watchdog().defer(item)

    # ------------------------------------------------------------------ primitives

    def _all_reduce(self, x: torch.Tensor, dtype: int, op: int, what: str) -> None:
        raise NotImplementedError

    def _broadcast_bytes(self, x: torch.Tensor, root: int, what: str) -> None:
        raise NotImplementedError

    def _reduce(self, x: torch.Tensor, dtype: int, op: int, root: int, what: str) -> None:
        raise NotImplementedError

    def _all_gather_bytes(self, out: torch.Tensor, inp: torch.Tensor, what: str) -> None:
        raise NotImplementedError

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, dtype: int, op: int,
                        what: str) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ collectives

    def _gathered(self, flat: torch.Tensor, what: str) -> list[torch.Tensor]:
        g = torch.empty((self.n, flat.numel()), dtype=flat.dtype, device=flat.device)
        self._all_gather_bytes(g.view(-1), flat, what)
        return list(g)

    def all_reduce(self, t: torch.Tensor, op: ReduceOp) -> concurrent.futures.Future:
        what = "all_reduce"
        with self._lock:
            self._usable(what)
            low = lower(self._solo(op), t.dtype, what)
            flat, post = dense(t)
            keep = [flat]
            if low.kind == "gather":
                reduce_into(flat, self._gathered(flat, what), op)
            else:
                x = as_lowered(flat, low)
                keep.append(x)
                self._all_reduce(x, low.nccl_dtype, low.nccl_op, what)
                if low.kind == "widen":
                    flat.copy_(x)
            if post is not None:
                post()
            return self._watch(what, keep)

    def broadcast(self, t: torch.Tensor, root: int) -> concurrent.futures.Future:
        what = "broadcast"
        with self._lock:
            self._usable(what)
            flat, post = dense(t)
            self._broadcast_bytes(flat, root, what)
            if post is not None and self.me != root:
                post()
            return self._watch(what, [flat])

    def reduce(self, t: torch.Tensor, op: ReduceOp, root: int) -> concurrent.futures.Future:
        what = "reduce"
        with self._lock:
            self._usable(what)
            low = lower(self._solo(op), t.dtype, what)
            flat, post = dense(t)
            keep = [flat]
            if low.kind == "gather":
                parts = self._gathered(flat, what)
                if self.me == root:
                    reduce_into(flat, parts, op)
            else:
                x = as_lowered(flat, low)
                keep.append(x)
                self._reduce(x, low.nccl_dtype, low.nccl_op, root, what)
                if low.kind == "widen" and self.me == root:
                    flat.copy_(x)
            if post is not None and self.me == root:
                post()
            return self._watch(what, keep)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> concurrent.futures.Future:
        what = "all_gather"
        with self._lock:
            self._usable(what)
            src, _ = dense(inp)
            dst, post = dense(out)
            if dst.numel() != src.numel() * self.n:
                raise ValueError(f"all_gather: the output has {dst.numel()} elements, not "
                                 f"{src.numel()} x {self.n}")
            self._all_gather_bytes(dst, src, what)
            if post is not None:
                post()
            return self._watch(what, [src, dst])

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor,
                       op: ReduceOp) -> concurrent.futures.Future:
        what = "reduce_scatter"
        with self._lock:
            self._usable(what)
            low = lower(self._solo(op), inp.dtype, what)
            src, _ = dense(inp)
            dst, post = dense(out)
            m = dst.numel()
            if src.numel() != m * self.n:
                raise ValueError(f"reduce_scatter: the input has {src.numel()} elements, "
                                 f"not {m} x {self.n}")
            keep = [src, dst]
            if low.kind == "gather":
                parts = self._gathered(src, what)
                reduce_into(dst, [p[self.me * m:(self.me + 1) * m] for p in parts], op)
            else:
                x_in, x_out = as_lowered(src, low), as_lowered(dst, low)
                keep += [x_in, x_out]
                self._reduce_scatter(x_out, x_in, low.nccl_dtype, low.nccl_op, what)
                if low.kind == "widen":
                    dst.copy_(x_out)
            if post is not None:
                post()
            return self._watch(what, keep)


# ---------------------------------------------------------------------- ctypes binding


class NcclComm(_Base):
    """A communicator of the ctypes binding: nonblocking, abortable, with async errors."""

    binding = "ctypes"

    def __init__(self, lib: N.Library, key: Any, group: Any, ranks: tuple[int, ...],
                 me: int, device: int, timeout: float) -> None:
        super().__init__(key, group, ranks, me, device, timeout)
        self.lib = lib
        self.comm = 0

    # ------------------------------------------------------------------ set-up

    def init(self, uid: bytes, deadline: float, check: Callable[[], None]) -> None:
        """Create the communicator (nonblocking) and wait until it is ready, polling
        NCCL's async error, the peers' liveness (``self.failure``, set by the watch),
        ``check()`` (raises when another member's set-up failed) and the deadline."""
        with torch.cuda.device(self.device):
            self.comm, code = self.lib.comm_init_rank(self.n, uid, self.me, blocking=False)
        self._progress(code, "ncclCommInitRankConfig", deadline, check)

    def _progress(self, code: int, call: str, deadline: float,
                  check: Callable[[], None] | None = None) -> None:
        """Wait while a nonblocking call is ncclInProgress (set-up, lazy connections)."""
        pause = 1e-5
        last_check = time.monotonic()
        while code == IN_PROGRESS:
            if self.failure is not None:
                raise self.failure
            now = time.monotonic()
            if check is not None and now - last_check > 0.1:
                last_check = now
                try:
                    check()
                except BaseException as e:
                    self.abort(e)
                    raise
            if now > deadline:
                err = DistTimeoutError(f"{PREFIX}{call} for {self.key} did not finish "
                                       f"within {self.timeout:g} s; aborted",
                                       collective=call, group=self.group)
                self.abort(err)
                raise err
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
            with self._nccl:
                if not self.comm:
                    raise self.failure or DistError(f"{PREFIX}{call}: aborted")
                code = self.lib.async_error(self.comm)
        if code != SUCCESS:
            err = self.lib.error(code, call, self.comm, group=self.group,
                                 peers=self.ranks)
            self.abort(err)
            raise err

    def check_async(self, what: str) -> BaseException | None:
        with self._nccl:
            if not self.comm or self.failure is not None:
                return self.failure
            code = self.lib.async_error(self.comm)
        if code in (SUCCESS, IN_PROGRESS):
            return None
        return self.lib.error(code, what, self.comm, collective=what, group=self.group,
                              peers=self.ranks)

    def _abort(self) -> None:
        if self.comm:
            self.lib.abort(self.comm)
            self.comm = 0

    # ------------------------------------------------------------------ primitives

    def _issue(self, code: int, what: str) -> None:
        if code == SUCCESS:
            return
        if code == IN_PROGRESS:
            self._progress(code, what, time.monotonic() + self.timeout)
            return
        err = self.lib.error(code, what, self.comm, collective=what, group=self.group,
                             peers=self.ranks)
        self.abort(err)  # a failed call leaves the communicator unusable
        raise err

    def _s(self) -> int:
        return self._stream().cuda_stream

    def _call(self, fn: Callable[..., int], *args: Any) -> int:
        """``fn(*args, comm, stream)`` under the library lock, on a live communicator."""
        with self._nccl:
            if not self.comm:
                raise self.failure or DistError(f"{PREFIX}the communicator of {self.key} "
                                                "was aborted")
            return fn(*args, self.comm, self._s())

    def _all_reduce(self, x: torch.Tensor, dtype: int, op: int, what: str) -> None:
        p = x.data_ptr()
        self._issue(self._call(self.lib.all_reduce_raw, p, p, x.numel(), dtype, op), what)

    def _broadcast_bytes(self, x: torch.Tensor, root: int, what: str) -> None:
        p = x.data_ptr()
        nbytes = x.numel() * x.element_size()
        self._issue(self._call(self.lib.broadcast_raw, p, p, nbytes, N.UINT8, root), what)

    def _reduce(self, x: torch.Tensor, dtype: int, op: int, root: int, what: str) -> None:
        p = x.data_ptr()
        self._issue(self._call(self.lib.reduce_raw, p, p, x.numel(), dtype, op, root), what)

    def _all_gather_bytes(self, out: torch.Tensor, inp: torch.Tensor, what: str) -> None:
        nbytes = inp.numel() * inp.element_size()
        self._issue(self._call(self.lib.all_gather_raw, inp.data_ptr(), out.data_ptr(),
                               nbytes, N.UINT8), what)

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, dtype: int, op: int,
                        what: str) -> None:
        self._issue(self._call(self.lib.reduce_scatter_raw, inp.data_ptr(), out.data_ptr(),
                               out.numel(), dtype, op), what)

    # ------------------------------------------------------------------ point-to-point

    def _p2p(self, t: torch.Tensor, peer: int, sending: bool) -> concurrent.futures.Future:
        what = "send" if sending else "recv"
        with self._lock:
            self._usable(what)
            flat, post = dense(t)
            nbytes = flat.numel() * flat.element_size()
            fn = self.lib.send_raw if sending else self.lib.recv_raw
            with self._nccl:  # one group: nothing else may call NCCL in between
                self._issue(self.lib.group_start(), "ncclGroupStart")
                code = self._call(fn, flat.data_ptr(), nbytes, N.UINT8, peer)
                end = self.lib.group_end()
            if code not in (SUCCESS, IN_PROGRESS):
                self._issue(code, what)
            self._issue(end, what)
            if post is not None and not sending:
                post()
            return self._watch(what, [flat])

    def send(self, t: torch.Tensor, peer: int) -> concurrent.futures.Future:
        return self._p2p(t, peer, True)

    def recv(self, t: torch.Tensor, peer: int) -> concurrent.futures.Future:
        return self._p2p(t, peer, False)


# ---------------------------------------------------------------------- torch's bindings


def torch_nccl_status() -> tuple[bool, str]:
    """Whether ``torch.cuda.nccl`` can create communicators in this process, and why not.

    torch's bindings have known traps: ``init_rank`` parses the unique id with a 32-bit
    length on some Python builds and fails (pytorch issue 38019); ``broadcast`` and
    ``reduce`` take the root as an index into their tensor list, so one tensor per
    process means root 0 only; destroying a communicator does nothing; ``init_rank``
    blocks until every rank has joined. The first is probed here (a wrong-length id
    must be refused by the length check, before NCCL is reached); the others are
    worked around by :class:`TorchNcclComm`.
    """
    try:
        import torch as _t
    except ImportError:
        return False, "torch is not installed"
    c = _t._C
    if not all(hasattr(c, f) for f in ("_nccl_init_rank", "_nccl_unique_id",
                                       "_nccl_all_reduce", "_nccl_version")):
        return False, "torch is not compiled with NCCL (torch.cuda.nccl is missing)"
    import torch.cuda.nccl as nccl

    try:
        nccl.init_rank(1, b"\0" * 5, 0)  # torch._C's, through its public wrapper
    except Exception as e:  # noqa: BLE001 - which exception tells the build apart
        return probe_verdict(e)
    return False, "torch.cuda.nccl.init_rank accepted a 5-byte unique id"


def probe_verdict(e: BaseException) -> tuple[bool, str]:
    """Judge the error ``init_rank`` raised for a 5-byte unique id: a sound build
    refuses it by its length ("expected 128 bytes, got 5"); a build with the bug of
    pytorch issue 38019 reads a garbage length, or cannot parse the bytes at all."""
    text = str(e)
    if "128" in text and re.search(r"(?<![\d.])5(?![\d.])", text.replace("128", "")):
        return True, "torch.cuda.nccl"
    return False, (f"torch.cuda.nccl.init_rank cannot parse a unique id on this Python "
                   f"build ({type(e).__name__}: {text[:200]}; pytorch issue 38019)")


class TorchNcclComm(_Base):
    """A communicator of ``torch.cuda.nccl``: used only where no libnccl can be opened
    with ctypes. Roots other than 0 are emulated (broadcast through all_gather, reduce
    through all_reduce into scratch); there is no abort and no async error, so a call
    that passes its deadline fails its future but may leave the stream blocked; no
    point-to-point (host staging serves it)."""

    binding = "torch"

    def __init__(self, key: Any, group: Any, ranks: tuple[int, ...], me: int, device: int,
                 timeout: float) -> None:
        super().__init__(key, group, ranks, me, device, timeout)
        self.comm: Any = None

    def init(self, uid: bytes, deadline: float, check: Callable[[], None]) -> None:
        import torch.cuda.nccl as tn

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                with torch.cuda.device(self.device):
                    box["comm"] = tn.init_rank(self.n, uid, self.me)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e

        th = threading.Thread(target=run, daemon=True, name="minidist-native-init-rank")
        th.start()
        while th.is_alive():
            th.join(0.05)
            if not th.is_alive():
                break
            if self.failure is not None:
                raise self.failure
            check()
            if time.monotonic() > deadline:
                err = DistTimeoutError(f"{PREFIX}torch.cuda.nccl.init_rank for {self.key} "
                                       f"did not return within {self.timeout:g} s (it "
                                       "cannot be aborted; its thread is left behind)",
                                       collective="init_rank", group=self.group)
                self.abort(err)
                raise err
        if "error" in box:
            e = box["error"]
            err = DistError(f"{PREFIX}torch.cuda.nccl.init_rank failed for {self.key}: "
                            f"{type(e).__name__}: {e}")
            self.abort(err)
            raise err from e
        self.comm = box["comm"]

    def _abort(self) -> None:
        self.comm = None  # torch's destroy is a no-op; nothing can stop its kernels

    def _all_reduce(self, x: torch.Tensor, dtype: int, op: int, what: str) -> None:
        import torch.cuda.nccl as tn

        tn.all_reduce([x], [x], op=op, comms=[self.comm])

    def _broadcast_bytes(self, x: torch.Tensor, root: int, what: str) -> None:
        import torch.cuda.nccl as tn

        raw = x.view(torch.uint8) if x.numel() else x
        if root == 0:
            tn.broadcast([raw], root=0, comms=[self.comm])
            return
        # torch's root is an index into the tensor list: emulate any other root
        g = torch.empty((self.n, raw.numel()), dtype=torch.uint8, device=raw.device)
        tn.all_gather([raw], [g.view(-1)], comms=[self.comm])
        raw.copy_(g[root])

    def _reduce(self, x: torch.Tensor, dtype: int, op: int, root: int, what: str) -> None:
        import torch.cuda.nccl as tn

        if root == 0:
            tn.reduce([x], output=x, root=0, op=op, comms=[self.comm])
            return
        scratch = x.clone()
        tn.all_reduce([scratch], [scratch], op=op, comms=[self.comm])
        if self.me == root:
            x.copy_(scratch)

    def _all_gather_bytes(self, out: torch.Tensor, inp: torch.Tensor, what: str) -> None:
        import torch.cuda.nccl as tn

        tn.all_gather([inp.view(torch.uint8)], [out.view(torch.uint8)], comms=[self.comm])

    def _reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, dtype: int, op: int,
                        what: str) -> None:
        import torch.cuda.nccl as tn

        tn.reduce_scatter([inp], [out], op=op, comms=[self.comm])

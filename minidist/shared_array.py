"""Versioned arrays that one rank publishes and every rank of a group reads in place.

``SharedArray(name, shape, dtype, src=0, group=None)`` is made by every member of the
group (a different name, shape, dtype, src or buffer count on any member raises
CollectiveMismatchError on every member). Global rank ``src`` calls :meth:`publish`
to make version 1, 2, ...; every member calls :meth:`SharedArray.read` for a read-only
numpy view of the latest complete version (no copy) and :meth:`SharedArray.wait` to
sleep until a version exists.

The data exists once per node: one /dev/shm segment per node (created by the node's
first member, opened by the others, unlinked once all have it mapped, so nothing is
left however the processes end), with ``buffers`` copies of the array and the
protocol of :mod:`minidist.versioned`. On ``src``'s node ``src`` writes the segment
directly; on every other node the node's first member (its *leader*) receives each
version once over the network (one message per version and node) into a free buffer
and makes it the node's latest, which wakes that node's readers.

A view stays valid until the same process's next ``read()`` (or ``release()``,
``close()``): until then the publisher writes other buffers, and with every other
buffer held by some reader it waits for one to move on (a reader that holds a view
for long therefore holds back new versions; a reader that died is noticed and
ignored).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import api, objects, segments, versioned
from .door import Door
from .errors import CollectiveMismatchError, DistError, DistTimeoutError, PeerLostError
from .group import Group
from .plan import P2P_TAG_LIMIT
from .shm import fast_slots

TAG_BASE = P2P_TAG_LIMIT + (1 << 24)  # internal tags of the shared arrays' versions
# a node leader's receive of the next version may wait as long as the learner takes to
# publish it: its messages go on the group with this timeout (a lost src still ends it)
RELAY_TIMEOUT = 10 * 365 * 86400.0
DEFAULT_BUFFERS = 3
_open: set[tuple[int, int, str]] = set()  # (door, group, name) of this process's arrays


class Layout:
    """Who does what for one shared array (the same record on every member)."""

    def __init__(self, g: Group, name: str, shape: tuple[int, ...], dtype: np.dtype,
                 src: int, buffers: int, nodes: list[int], me: int) -> None:
        self.group, self.name, self.shape, self.dtype = g, name, shape, dtype
        self.src, self.buffers, self.me = src, buffers, me
        self.nbytes = math.prod(shape) * dtype.itemsize
        by_node: dict[int, list[int]] = {}
        for r, node in zip(g.ranks, nodes):
            by_node.setdefault(node, []).append(r)
        src_node = nodes[g.rank_of(src)]
        mine = nodes[g.rank_of(me)]
        self.local = by_node[mine]  # the global ranks of this node's members, in order
        self.member = self.local.index(me)
        self.creator = self.local[0]
        # the rank that writes this node's versions: src, or the node's leader
        self.writer = src if mine == src_node else self.local[0]
        self.leaders = [ranks[0] for node, ranks in by_node.items() if node != src_node]
        digest = hashlib.blake2b(f"{g.id}:{name}".encode(), digest_size=8).digest()
        self.key = int.from_bytes(digest, "little")
        self.tag = TAG_BASE + (self.key & 0xFFFFFF)
        self.relay_group = dataclasses.replace(g, timeout=RELAY_TIMEOUT)  # the same id

    def what(self) -> str:
        return f"SharedArray {self.name!r}"


def _signature(name: str, shape: tuple[int, ...], dtype: np.dtype, src: int,
               buffers: int) -> tuple:
    return (name, shape, dtype.str, src, buffers)


def _describe(sig: tuple) -> str:
    name, shape, dtype, src, buffers = sig
    return (f"name={name!r}, shape={shape}, dtype={np.dtype(dtype)}, src={src}, "
            f"buffers={buffers}")


def _check_args(d: Door, name: str, shape: Any, dtype: Any, src: int, group: Any,
                buffers: int) -> tuple[Group, tuple[int, ...], np.dtype]:
    g = d.group_of(group)
    if not (fast_slots.available() and segments.available()):
        raise DistError("SharedArray needs Linux on x86-64 with /dev/shm (futexes and "
                        "x86 memory ordering)")
    if not isinstance(name, str) or not name:
        raise ValueError(f"SharedArray: name must be a non-empty str, not {name!r}")
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(n, (int, np.integer)) and n >= 0 for n in shape):
        raise ValueError(f"SharedArray {name!r}: shape must be non-negative ints, not {shape}")
    shape = tuple(int(n) for n in shape)
    dt = np.dtype(dtype)
    if dt.hasobject:
        raise TypeError(f"SharedArray {name!r}: dtype {dt} holds Python objects")
    if src not in g:
        raise ValueError(f"SharedArray {name!r}: src={src} is not a rank of {g!r}")
    if not isinstance(buffers, int) or not 2 <= buffers <= versioned.MAX_BUFFERS:
        raise ValueError(f"SharedArray {name!r}: buffers must be 2..{versioned.MAX_BUFFERS}")
    if (id(d), g.id, name) in _open:
        raise ValueError(f"SharedArray {name!r} on {g!r} is already open in this process")
    return g, shape, dt


async def setup(d: Door, name: str, shape: Any, dtype: Any, src: int, group: Any,
                buffers: int) -> tuple[Layout, versioned.NodeBuffers]:
    """Make the array on this member (every member of the group calls it, on the loop):
    compare signatures, create or open this node's segment, unlink it once every member
    has it mapped."""
    g, shape, dt = _check_args(d, name, shape, dtype, src, group, buffers)
    sig = _signature(name, shape, dt, src, buffers)
    everyone = await d.steps_on_loop(objects.all_gather_object(d, (sig, d.node_rank), g))
    for r, (theirs, _node) in zip(g.ranks, everyone):
        if theirs != everyone[0][0]:
            raise CollectiveMismatchError(
                f"SharedArray made differently: rank {r} has {_describe(theirs)} where rank "
                f"{g.ranks[0]} has {_describe(everyone[0][0])}")
    lay = Layout(g, name, shape, dt, src, buffers, [n for _s, n in everyone], d.rank)
    size = versioned.segment_bytes(lay.nbytes, buffers, len(lay.local))
    seg_name, fd = None, -1
    try:
        said: Any = None
        if d.rank == lay.creator:
            seg_name = segments.segment_name(d.job, lay.key, os.getpid())
            try:
                fd = versioned.create(seg_name, size)
                said = ("ok", seg_name)
            except DistError as e:
                seg_name, said = None, ("error", f"rank {d.rank}: {e}")
        names = await d.steps_on_loop(objects.all_gather_object(d, said, g))
        failed = [m for m in names if m is not None and m[0] == "error"]
        if failed:
            raise DistError(f"{lay.what()}: {failed[0][1]}")
        problem = None
        if fd < 0:
            try:
                fd = versioned.attach(names[g.rank_of(lay.creator)][1])
            except FileNotFoundError:
                problem = f"rank {d.rank} could not open its node's segment"
        mapped = None
        if problem is None:
            mapped = versioned.NodeBuffers(fd, lay.nbytes, buffers, len(lay.local),
                                           lay.member, d.rank == lay.writer)
            fd = -1
        problems = [p for p in await d.steps_on_loop(
            objects.all_gather_object(d, problem, g)) if p]
        if problems:
            if mapped is not None:
                mapped.close()
            raise DistError(f"{lay.what()}: {problems[0]}")
    finally:
        if fd >= 0:
            os.close(fd)
        if seg_name is not None:
            segments.unlink(seg_name)  # every member has it mapped (or gave up)
    _open.add((id(d), g.id, name))
    return lay, mapped


class Shared:
    """What the blocking and the asyncio shared arrays have in common: reading, the
    checks of a wait, the relay of versions to a node that ``src`` is not on."""

    def __init__(self, d: Door, lay: Layout, buf: versioned.NodeBuffers) -> None:
        self._door, self._lay, self._buf = d, lay, buf
        self._closed = False
        self._version = 0  # src: the versions published so far
        self._relay_error: DistError | None = None
        self._relay: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        views = []
        for raw in buf.raw:
            v = raw.view(lay.dtype).reshape(lay.shape)
            v.flags.writeable = False
            views.append(v)
        self._views = views

    # ------------------------------------------------------------------ what it is

    @property
    def name(self) -> str:
        return self._lay.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self._lay.shape

    @property
    def dtype(self) -> np.dtype:
        return self._lay.dtype

    @property
    def src(self) -> int:
        """The global rank that publishes."""
        return self._lay.src

    @property
    def group(self) -> Group:
        return self._lay.group

    @property
    def latest(self) -> int:
        """The latest version on this node (0 before the first), without pinning it."""
        self._live()
        return self._buf.latest

    def __repr__(self) -> str:
        lay = self._lay
        state = "closed" if self._closed else f"version {self._buf.latest}"
        return (f"<{type(self).__name__} {lay.name!r} shape={lay.shape} dtype={lay.dtype} "
                f"src={lay.src} {state}>")

    # ------------------------------------------------------------------ reading

    def read(self) -> tuple[np.ndarray, int]:
        """(a read-only view of the latest complete version, its number); zeros and 0
        before the first. No copy. The view stays valid (its bytes unchanged) until this
        process's next read(), release() or close() on this array."""
        self._live()
        b, v = self._buf.pin_latest()
        return self._views[b], v

    def release(self) -> None:
        """Give back the version the last read() returned (its view may change after)."""
        self._live()
        self._buf.release()

    def _live(self) -> None:
        if self._closed:
            raise DistError(f"{self._lay.what()} is closed")

    def _check(self) -> DistError | None:
        """Why no version may come any more (read from the waiting thread), or None."""
        lay, d = self._lay, self._door
        if self._relay_error is not None:
            return self._relay_error
        for r, role in ((lay.src, "its publisher"),
                        (lay.writer, "the rank that brings its versions to this node")):
            if r == lay.me or (role != "its publisher" and r == lay.src):
                continue
            err = d.gone(lay.group, r)
            if err is not None:
                left = getattr(err, "left", False)
                return PeerLostError(f"{lay.what()}: {role}, rank {r}, "
                                     f"{'left the job' if left else 'died'} ({err})",
                                     ranks=[r], left=left, group=lay.group)
        return None

    def _wait_blocking(self, version: int, timeout: float | None,
                       stop: threading.Event | None = None) -> int:
        self._live()
        lay = self._lay
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
            raise TypeError(f"{lay.what()}: wait needs a version number, not {version!r}")
        t = self._door.timeout_of(lay.group) if timeout is None else float(timeout)

        def check() -> DistError | None:
            if stop is not None and stop.is_set():
                return DistError("cancelled")
            return self._check()

        try:
            return self._buf.wait(int(version), time.monotonic() + t, check)
        except TimeoutError as e:
            raise DistTimeoutError(
                f"{lay.what()}: version {version} did not come within {t:g} s on rank "
                f"{lay.me} (latest here: {e.args[0]}; the publisher is rank {lay.src})",
                collective="SharedArray.wait", group=lay.group, missing=[lay.src]) from None

    # ------------------------------------------------------------------ writing

    def _check_publish(self, array: Any, fill: bool = False) -> np.ndarray | None:
        self._live()
        lay = self._lay
        if lay.me != lay.src:
            raise DistError(f"{lay.what()}: only its src, rank {lay.src}, publishes (this "
                            f"is rank {lay.me})")
        if self._version >= versioned.MAX_VERSION:
            raise DistError(f"{lay.what()}: no version numbers left")
        if fill:
            return None
        a = np.asarray(array)
        if a.shape != lay.shape:
            raise ValueError(f"{lay.what()}: publish got shape {a.shape}, the array has "
                             f"{lay.shape}")
        if a.dtype != lay.dtype:
            raise TypeError(f"{lay.what()}: publish got dtype {a.dtype}, the array has "
                            f"{lay.dtype}")
        return a

    def _stale(self, members: list[int]) -> None:
        """Clear the pins of the node's members that are gone."""
        lay = self._lay
        for m in members:
            if self._door.gone(lay.group, lay.local[m]) is not None:
                self._buf.clear_pin(m)

    def _claim_blocking(self) -> int:
        lay = self._lay
        t = self._door.timeout_of(lay.group)
        try:
            return self._buf.claim(time.monotonic() + t, self._stale, lambda: None)
        except TimeoutError as e:
            held = [lay.local[m] for m in e.args[0]]
            raise DistTimeoutError(
                f"{lay.what()}: every buffer is held by readers (ranks {held} still read "
                f"older versions) for {t:g} s; a reader's view is held until its next "
                "read() or release()", collective="SharedArray.publish", group=lay.group,
                missing=held) from None

    def _copy_in(self, b: int, a: np.ndarray | Callable[[np.ndarray], None]) -> int:
        """Copy ``a`` into claimed buffer ``b`` (or let ``a`` fill it) and make it the
        next version."""
        into = self._buf.raw[b].view(self._lay.dtype).reshape(self._lay.shape)
        if callable(a):
            a(into)
        else:
            np.copyto(into, a)
        self._version += 1
        self._buf.commit(b, self._version)
        return self._version

    def _sends(self, b: int) -> list[tuple[int, Any]]:
        """(leader, its message) for every node leader still there. A leader that is
        gone gets no more versions (its node's readers hear that it is lost)."""
        d, lay = self._door, self._lay
        lay.leaders = [r for r in lay.leaders if d.gone(lay.group, r) is None]
        return [(r, d.plan.prepare_send(self._buf.raw[b], r, lay.tag, lay.relay_group,
                                        internal=True)) for r in lay.leaders]

    def _sent(self, leader: int, error: BaseException | None) -> None:
        """A send to ``leader`` ended with ``error``: a lost leader is dropped (the
        learner publishes on to the other nodes); anything else raises."""
        if isinstance(error, PeerLostError):
            with contextlib.suppress(ValueError):
                self._lay.leaders.remove(leader)
        elif error is not None:
            raise error

    # ------------------------------------------------------------------ the relay

    def _start_relay(self) -> None:
        """On the loop, at set-up: a node leader that is not src receives every version."""
        lay = self._lay
        if lay.writer == lay.me and lay.me != lay.src:
            self._loop = asyncio.get_running_loop()
            self._relay = self._loop.create_task(self._relay_versions())
            self._relay.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _relay_versions(self) -> None:
        d, lay, buf = self._door, self._lay, self._buf
        n = 0
        try:
            while True:
                b, pause = buf.try_claim(), 0.0005
                while b < 0:  # every other buffer is read: wait until a reader moves on
                    self._stale(buf.pinning())
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 0.01)
                    b = buf.try_claim()
                await d.on_loop(d.plan.prepare_recv(buf.raw[b], lay.src, lay.tag,
                                                    lay.relay_group, internal=True))
                n += 1
                buf.commit(b, n)
        except DistError as e:
            self._relay_error = e
            if not isinstance(e, PeerLostError):  # a lost src is seen by every reader
                buf.fail()

    def _stop_relay(self) -> None:
        if self._relay is not None and self._loop is not None:
            self._buf.fail()  # this node's readers get no more versions: they raise
            with contextlib.suppress(RuntimeError):  # the loop is gone already
                self._loop.call_soon_threadsafe(self._relay.cancel)

    def _unmap(self) -> None:
        self._closed = True
        _open.discard((id(self._door), self._lay.group.id, self._lay.name))
        self._views = []
        self._buf.close()


class SharedArray(Shared):
    """A versioned array published by global rank ``src`` and read in place by every
    member of ``group`` (see the module's text); made by every member.

    ``buffers`` (2..16, default 3) copies of the array live in each node's segment:
    more let readers hold older views longer without holding back the publisher.
    DistError if a node's /dev/shm cannot hold them (the message names the size).
    """

    def __init__(self, name: str, shape: Any, dtype: Any, src: int = 0,
                 group: Any = None, *, buffers: int = DEFAULT_BUFFERS) -> None:
        d = api.door()
        lay, buf = d.block(setup(d, name, shape, dtype, src, group, buffers))
        super().__init__(d, lay, buf)
        if lay.writer == lay.me and lay.me != lay.src:
            d.block(self._relay_starter())
        self._pending: list[tuple[int, concurrent.futures.Future]] = []

    async def _relay_starter(self) -> None:
        self._start_relay()

    def publish(self, array: Any) -> int:
        """Copy ``array`` (this array's shape and dtype) into a buffer nobody reads and
        make it the next version; its number (1, 2, ...). Only on ``src``. Readers on
        other nodes get it in the background; the next publish first waits until it
        is on its way to them."""
        return self._publish(self._check_publish(array))

    def publish_with(self, fill: Callable[[np.ndarray], None]) -> int:
        """Like :meth:`publish`, but ``fill(buffer)`` writes the new version into
        ``buffer`` (a writable array of this shape and dtype that nobody reads) in
        place: no array to copy from (``minidist.torch.share_module`` copies each
        parameter straight in). If ``fill`` raises, no version is made."""
        if not callable(fill):
            raise TypeError(f"{self._lay.what()}: publish_with needs a callable")
        self._check_publish(None, fill=True)
        return self._publish(fill)

    def _publish(self, a: np.ndarray | Callable[[np.ndarray], None]) -> int:
        self._flush()
        b = self._claim_blocking()
        v = self._copy_in(b, a)
        d = self._door
        self._pending = [(r, d.submit(item)) for r, item in self._sends(b)]
        return v

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for r, f in pending:  # ends with the send, or with the loss of its node's leader
            self._sent(r, f.exception())

    def wait(self, version: int, timeout: float | None = None) -> int:
        """Sleep (no CPU) until version ``version`` or a later one exists on this node;
        the latest version then. ``timeout`` in seconds (None: the group's timeout):
        DistTimeoutError past it; PeerLostError naming the publisher (or this node's
        leader) if it died or left."""
        return self._wait_blocking(version, timeout)

    def close(self) -> None:
        """Release this process's view and unmap its segment (not collective). Views
        still held keep their pages until dropped but are no longer protected."""
        if self._closed:
            return
        try:
            self._flush()
        except Exception:  # noqa: BLE001 - closing: a lost peer was reported before
            pass
        self._stop_relay()
        self._unmap()

    def __enter__(self) -> SharedArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncSharedArray(Shared):
    """:class:`SharedArray` for :mod:`minidist.aio`: made with ``await
    minidist.aio.shared_array(...)``; ``publish``, ``wait`` and ``close`` are
    coroutines, ``read`` is a plain call (it never waits). A wait sleeps in a thread
    of the loop's default executor, so the loop runs on."""

    def __init__(self, d: Door, lay: Layout, buf: versioned.NodeBuffers) -> None:
        super().__init__(d, lay, buf)
        self._pending: list[tuple[int, asyncio.Future]] = []

    @classmethod
    async def create(cls, d: Door, name: str, shape: Any, dtype: Any, src: int = 0,
                     group: Any = None, *, buffers: int = DEFAULT_BUFFERS
                     ) -> AsyncSharedArray:
        """Made by every member of the group on its running loop."""
        lay, buf = await setup(d, name, shape, dtype, src, group, buffers)
        self = cls(d, lay, buf)
        self._start_relay()
        return self

    async def publish(self, array: Any) -> int:
        """See :meth:`SharedArray.publish`."""
        a = self._check_publish(array)
        await self._flush()
        b = self._buf.try_claim()
        if b < 0:  # every other buffer is read: wait off the loop
            b = await asyncio.get_running_loop().run_in_executor(None, self._claim_blocking)
        v = self._copy_in(b, a)
        self._pending = [(r, asyncio.ensure_future(self._door.run(item)))
                         for r, item in self._sends(b)]
        return v

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for r, f in pending:
            try:
                await f
            except PeerLostError as e:
                self._sent(r, e)

    async def wait(self, version: int, timeout: float | None = None) -> int:
        """See :meth:`SharedArray.wait`; cancelling it stops the waiting thread within
        0.1 s."""
        self._live()
        latest = self._buf.latest
        if isinstance(version, int) and latest >= version:
            return latest
        stop = threading.Event()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, self._wait_blocking, version, timeout, stop)
        finally:
            stop.set()

    async def close(self) -> None:
        """See :meth:`SharedArray.close`."""
        if self._closed:
            return
        with contextlib.suppress(Exception):
            await self._flush()
        self._stop_relay()
        self._unmap()

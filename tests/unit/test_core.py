"""The compiled core (minidist.shm._core) against the pure one, in one process: every rank
of a group runs its roles of the rooted area (minidist.shm.rooted_area) and its inbox rings
(minidist.shm.inbox) on one segment, each rank on the core the test draws; the segment's
every byte, the outputs and the errors must be those of an all-pure run. Plus the
core's refusals of layouts and arrays that do not fit, and how a process chooses and
names its core."""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from minidist.errors import CollectiveMismatchError
from minidist.group import Group
from minidist.shm import core, fast_slots, inbox
from minidist.shm.area_layout import piece_bytes
from minidist.shm.rooted_area import GATHER, SCATTER, Rooted, signature

needs_core = pytest.mark.skipif(core.compiled is None, reason="the compiled core is not built")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Waited(Exception):
    """A role waited for a rank (which in a job would be the rank that gave up)."""


class NoWaits:
    """Hooks of a call run after every rank before it ran its part: any wait raises."""

    def __getattr__(self, name):
        raise Waited(name)


def _call(kind: int, count: int, dtype: np.dtype, root: int, seq: int):
    from minidist import ops

    return types.SimpleNamespace(kind=kind, dtype=ops.dtype_code(dtype), op=0, root=root,
                                 count=count, shape=count, seq=seq,
                                 describe=lambda: ("scatter" if kind == SCATTER else "gather"))


def _areas(n: int, compiled: list[bool]) -> tuple[mmap.mmap, list[Rooted]]:
    seg = mmap.mmap(-1, fast_slots.segment_bytes(n))
    g = Group(7, tuple(range(n)))
    areas = []
    for me in range(n):
        a = Rooted(seg, g, me)
        if not compiled[me]:
            if a.core is not None:
                a.core.release()
            a.core = None
        areas.append(a)
    return seg, areas


def _data(seed: int, r: int, count: int, dtype) -> np.ndarray:
    bits = np.random.default_rng([seed, r]).integers(0, 256, count * np.dtype(dtype).itemsize,
                                                     dtype=np.uint8)
    return bits.view(dtype)


def _run(n: int, compiled: list[bool], calls: list[tuple], odd: tuple | None = None,
         odd_kind: bool = False):
    """Run ``calls`` (kind, root, count, dtype) in turn on every rank; ``odd`` (call
    index, rank): that rank calls with one element more (``odd_kind``: calls the other
    kind, the same count, unless it is the root). The segment's bytes, every output, and
    each rank's error text."""
    seg, areas = _areas(n, compiled)
    outs, errors = [], {}
    try:
        for f, (kind, root, count, dtype) in enumerate(calls):
            order = ([root] + [r for r in range(n) if r != root] if kind == SCATTER
                     else [r for r in range(n) if r != root] + [root])
            if odd_kind and odd is not None and odd[0] == f:  # it comes first: only the
                order.remove(odd[1])  # root's next call can find what it did
                order.insert(0, odd[1])
            for r in order:
                if r in errors:
                    continue
                c, k = count, kind
                if odd == (f, r) and not odd_kind:
                    c += 1
                elif odd == (f, r) and r != root:
                    k = GATHER if kind == SCATTER else SCATTER
                call = _call(k, c, dtype, root, 100 + f)
                if k == SCATTER:
                    out = np.zeros(c, dtype)
                    src = (np.concatenate([_data(f, q, c, dtype) for q in range(n)])
                           if r == root else out[:0])
                else:
                    src = _data(f, r, c, dtype)
                    out = np.zeros(n * c, dtype) if r == root else src[:0]
                try:
                    areas[r].run(f, call, out, src, 1e18, NoWaits(),
                                 signature(call, root))
                except (CollectiveMismatchError, Waited) as e:
                    errors[r] = f"{type(e).__name__}: {e}"
                outs.append(out.tobytes())
        return bytes(seg), outs, errors
    finally:
        for a in areas:
            if a.core is not None:
                a.core.release()
        del areas
        gc.collect()  # the areas' views of the segment go with them
        with contextlib.suppress(BufferError):  # (an error's traceback may hold one)
            seg.close()


CALLS = st.lists(st.tuples(st.sampled_from([SCATTER, GATHER]), st.integers(0, 4),
                           st.sampled_from([1, 3, 17]),
                           st.sampled_from([np.uint8, np.int32, np.float64])),
                 min_size=1, max_size=8)


@needs_core
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 5), calls=CALLS, cores=st.lists(st.booleans(), min_size=5,
                                                         max_size=5))
def test_scatters_and_gathers_write_the_same_bytes_on_either_core(n, calls, cores):
    calls = [(k, root % n, c, d) for k, root, c, d in calls]
    want = _run(n, [False] * n, calls)
    got = _run(n, cores[:n], calls)
    assert got[2] == want[2] == {}
    assert got[1] == want[1]
    assert got[0] == want[0]


@needs_core
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 4), kind=st.sampled_from([SCATTER, GATHER]), then=st.sampled_from(
    [SCATTER, GATHER]), odd_kind=st.booleans(), root=st.integers(0, 3),
    odd=st.integers(0, 3), cores=st.lists(st.booleans(), min_size=4, max_size=4))
@example(n=3, kind=SCATTER, then=GATHER, odd_kind=True, root=0, odd=1,
         cores=[True, False, True, True])  # the root's gather finds it (its settle)
@example(n=3, kind=SCATTER, then=SCATTER, odd_kind=False, root=2, odd=0,
         cores=[True, True, True, False])
def test_a_rank_that_calls_something_else_is_named_alike_on_either_core(
        n, kind, then, odd_kind, root, odd, cores):
    """Another count or another kind on one rank (a scatter's mismatch found by its root
    at its next call, a gather's at once): the same errors, outputs and bytes."""
    root, odd, cores = root % n, odd % n, cores[:n]
    assume(not (odd_kind and odd == root))  # (a root calls its own kind)
    calls = [(kind, root, 3, np.int32), (then, root, 3, np.int32),
             (GATHER, root, 2, np.int32)]
    want = _run(n, [False] * n, calls, odd=(0, odd), odd_kind=odd_kind)
    got = _run(n, cores, calls, odd=(0, odd), odd_kind=odd_kind)
    assert got[2] == want[2] and want[2]
    assert got[1] == want[1]
    assert got[0] == want[0]


@needs_core
@settings(max_examples=60, deadline=None)
@given(rings=st.integers(1, 4), steps=st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 600), st.booleans(), st.booleans()),
    min_size=1, max_size=24))
def test_inbox_records_are_the_same_bytes_on_either_core(rings, steps):
    """Senders put records (a 64-byte header, a payload), the reader takes them when
    their header is the one it expects: the same answers and the same segment bytes."""
    def play(compiled_put: bool, compiled_take: bool):
        seg = mmap.mmap(-1, inbox.inbox_bytes(rings))
        np.frombuffer(seg, np.int32)[0] = 1  # OPEN
        box = core.compiled.Box(seg, rings, inbox.HEADER, inbox.CTRL, inbox.data_at(rings),
                                inbox.RECORD, inbox.RING_SLOTS, 0, 4, 8, 0, 32)
        outs = [inbox.Outbox(seg, rings, r) for r in range(rings)]
        reader = object.__new__(inbox.Inbox)  # the reading side, without making a segment
        reader.mv = memoryview(np.frombuffer(seg, np.uint8))
        reader.core = box if compiled_take else None
        reader.ints = reader.mv.cast("i")
        reader.words = np.frombuffer(seg, np.int32)
        reader._find_rings(rings)
        answers = []
        for i, (ring, size, take, right) in enumerate(steps):
            ring %= rings
            header = bytes([i % 251]) * 64
            o = outs[ring]
            if not compiled_put:
                o.core = None
            answers.append(o.put(header, np.full(size, i, np.uint8)))
            if take:
                into = bytearray(size)
                want = header if right else bytes(64)
                took = reader.take_if(ring, want, memoryview(into))
                answers.append((took, bytes(into)))
        reader.ints.release()
        reader.mv.release()
        for o in outs:
            if o.core is not None:
                o.core.release()
        box.release()
        data = bytes(seg)
        return data, answers

    want = play(False, False)
    assert play(True, True) == want
    assert play(True, False) == want
    assert play(False, True) == want


@needs_core
def test_layouts_and_arrays_that_do_not_fit_are_refused_and_change_nothing():
    n = 3
    seg = mmap.mmap(-1, fast_slots.segment_bytes(n))
    g = Group(7, tuple(range(n)))
    a = Rooted(seg, g, 0)
    with pytest.raises(ValueError, match="does not fit"):
        core.compiled.Area(seg, len(seg) - 64, 4096, n, 0, 64, 2 * n * 64, 4096, 64)
    with pytest.raises(ValueError, match="does not fit"):
        core.compiled.Area(seg, 0, len(seg), n, n, 64, 2 * n * 64, 4096, 64)
    with pytest.raises(ValueError, match="does not fit"):
        core.compiled.Box(seg, 1 << 20, 64, 64, 64 << 20, inbox.RECORD, inbox.RING_SLOTS,
                          0, 4, 8, 0, 32)
    before = bytes(seg)
    key = b"k" * 28
    out = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="bytes where"):  # src: not n pieces of nb
        a.core.scatter_root(0, key, 1, np.zeros(5, np.uint8), out, 4)
    with pytest.raises(ValueError, match="more bytes than a piece"):
        a.core.scatter_root(0, key, 1, np.zeros(3 << 20, np.uint8), out, 1 << 20)
    with pytest.raises(ValueError, match="28 bytes"):
        a.core.gather_send(0, 1, b"short", 1, out, 4)
    with pytest.raises(ValueError, match="rank out of range"):
        a.core.gather_send(0, n, key, 1, out, 4)
    with pytest.raises((BufferError, ValueError), match="read-only"):  # a read-only output
        ro = np.zeros(4, np.uint8)
        ro.flags.writeable = False
        a.core.scatter_root(0, key, 1, np.zeros(12, np.uint8), ro, 4)
    assert bytes(seg) == before
    assert piece_bytes(n) == a.piece
    a.core.release()
    with pytest.raises(ValueError, match="released"):
        a.core.gather_send(0, 1, key, 1, out, 4)
    del a
    gc.collect()
    seg.close()


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items()
         if k not in ("MINIDIST_CORE", "MINIDIST_REQUIRE_CORE")}
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=60)


BLOCK_CORE = "import sys; sys.modules['minidist.shm._core'] = None; "


@pytest.mark.timeout(120)
def test_a_process_names_its_core_and_why():
    info = "import sys; from minidist.__main__ import main; sys.exit(main(['info']))"
    r = _python(info, MINIDIST_CORE="0")
    assert r.returncode == 0 and "core: pure" in r.stdout and "MINIDIST_CORE=0" in r.stdout
    r = _python(BLOCK_CORE + info)
    assert "core: pure" in r.stdout and "not built" in r.stdout, r.stdout
    if core.compiled is not None:
        r = _python(info)
        assert "core: compiled" in r.stdout, r.stdout + r.stderr
    # an optional build hides a broken one: MINIDIST_REQUIRE_CORE=1 makes it an error
    r = _python(BLOCK_CORE + "import minidist", MINIDIST_REQUIRE_CORE="1")
    assert r.returncode != 0 and "MINIDIST_REQUIRE_CORE=1" in r.stderr, r.stderr
    r = _python(BLOCK_CORE + "import minidist", MINIDIST_REQUIRE_CORE="1", MINIDIST_CORE="0")
    assert r.returncode == 0, r.stderr  # the pure core was asked for


@pytest.mark.timeout(120)
def test_a_job_on_the_pure_core_says_so_once_at_init_unless_asked_for():
    job = ("import minidist, numpy as np; minidist.init(rank=0, world_size=1, "
           "master_addr='127.0.0.1', master_port=0); x = np.ones(3); minidist.all_reduce(x);"
           " minidist.destroy(); minidist.init(rank=0, world_size=1, "
           "master_addr='127.0.0.1', master_port=0); minidist.destroy(); print('OK', x[0])")
    r = _python(BLOCK_CORE + job)
    assert "OK 1.0" in r.stdout, r.stderr
    assert r.stderr.count("pure-Python core") == 1, r.stderr
    assert "minidist info" in r.stderr
    r = _python(BLOCK_CORE + job, MINIDIST_CORE="0")
    assert "OK 1.0" in r.stdout and "pure-Python core" not in r.stderr, r.stderr
    if core.compiled is not None:
        r = _python(job)
        assert "OK 1.0" in r.stdout and "pure-Python core" not in r.stderr, r.stderr

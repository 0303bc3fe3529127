"""Run the schedules of N virtual ranks in one process, over numpy arrays.

For tests and for people studying the algorithms. :func:`run` executes a list of
schedules (one per rank) over caller-provided buffers; :func:`simulate` builds the
buffers from per-rank inputs and returns each rank's output; :func:`first_out_writes`
and :func:`check_out_contract` trace which ranks' inputs a rank has heard from when it
first writes ``"out"``. Anything wrong (a deadlock, a message nobody receives, a Send
and Recv of different lengths, out-of-range offsets, conflicting ops in one step)
raises :class:`SimulationError` with the ranks, steps and ops involved.

Message passing is eager by default (a Send completes at once, its data buffered, as
over a socket with room in its buffers). ``rendezvous=True`` is stricter: a Send
completes only when its Recv is posted, as when buffers are full; schedules that finish
under it cannot deadlock however the transport buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..ops import ReduceOp, check_op, finish, reduce_into
from . import IN_PLACE, REDUCING, ROOTED, make_schedule
from .analysis import ScheduleError, stats, validate
from .schedule import Copy, Recv, Reduce, Schedule, Send, apply_compute

__all__ = [
    "OutWrite", "SimulationError", "check_out_contract", "first_out_writes", "run",
    "simulate", "stats",
]


class SimulationError(RuntimeError):
    """The schedules cannot run correctly together (or one breaks the contract)."""


Combine = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
# on_recv(rank, step, recv, data) before data lands; on_compute(rank, step, op) before op.
OnRecv = Callable[[int, int, Recv, np.ndarray], None]
OnCompute = Callable[[int, int, Reduce | Copy], None]
OnSend = Callable[[int, int, Send], None]


def _check_group(schedules: Sequence[Schedule]) -> None:
    if not schedules:
        raise SimulationError("no schedules to run")
    size = len(schedules)
    first = schedules[0]
    for r, s in enumerate(schedules):
        if s.rank != r or s.size != size:
            raise SimulationError(
                f"schedule {r} is for rank {s.rank} of {s.size}, expected rank {r} of {size}")
        key, want = ((s.collective, s.algorithm, s.count, s.root),
                     (first.collective, first.algorithm, first.count, first.root))
        if key != want:
            raise SimulationError(f"rank {r} runs {key}, rank 0 runs {want}")
        try:
            validate(s)
        except ScheduleError as e:
            raise SimulationError(str(e)) from e


def _execute(
    schedules: Sequence[Schedule],
    buffers: Sequence[Mapping[str, np.ndarray]],
    combine: Combine,
    *,
    rendezvous: bool = False,
    on_recv: OnRecv | None = None,
    on_compute: OnCompute | None = None,
    on_send: OnSend | None = None,
) -> None:
    """Run all ranks' schedules to completion; see the module docstring."""
    _check_group(schedules)
    size = len(schedules)
    if len(buffers) != size:
        raise SimulationError(f"{size} schedules but {len(buffers)} buffer sets")
    for r, s in enumerate(schedules):
        for name, need in (("in", s.in_size), ("out", s.out_size), ("tmp", s.tmp_size)):
            have = buffers[r].get(name)
            if need and (have is None or len(have) < need):
                got = "none" if have is None else len(have)
                raise SimulationError(f"rank {r}: buffer {name!r} needs {need} elements, got {got}")

    pc = [0] * size  # current step of each rank
    entered = [False] * size  # whether the current step's sends are posted
    waiting: list[dict[tuple[int, int], Recv]] = [{} for _ in range(size)]
    unsent: list[set[tuple[int, int, int]]] = [set() for _ in range(size)]  # rendezvous
    mailbox: dict[tuple[int, int, int], tuple[np.ndarray, Send, int]] = {}
    used: set[tuple[int, int, int]] = set()

    def where(r: int) -> str:
        s = schedules[r]
        return f"{s.collective}/{s.algorithm} rank {r} step {pc[r]}"

    while True:
        progress = False
        for r in range(size):
            steps = schedules[r].steps
            bufs = buffers[r]
            while pc[r] < len(steps):
                st = steps[pc[r]]
                if not entered[r]:
                    for c in st.comms:
                        if isinstance(c, Send):
                            key = (r, c.peer, c.tag)
                            if key in used:
                                raise SimulationError(
                                    f"{where(r)}: second message to rank {c.peer} with tag {c.tag}")
                            used.add(key)
                            mailbox[key] = (np.array(bufs[c.buf][c.lo:c.hi], copy=True), c, pc[r])
                            if on_send is not None:
                                on_send(r, pc[r], c)
                            if rendezvous:
                                unsent[r].add(key)
                        else:
                            waiting[r][(c.peer, c.tag)] = c
                    entered[r] = True
                    progress = True
                for (peer, tag), c in list(waiting[r].items()):
                    key = (peer, r, tag)
                    if key not in mailbox:
                        continue
                    data, send, send_step = mailbox.pop(key)
                    if len(data) != c.hi - c.lo:
                        raise SimulationError(
                            f"length mismatch: rank {peer} step {send_step} {send} sends "
                            f"{len(data)} elements, {where(r)} {c} expects {c.hi - c.lo}")
                    if on_recv is not None:
                        on_recv(r, pc[r], c, data)
                    bufs[c.buf][c.lo:c.hi] = data
                    del waiting[r][(peer, tag)]
                    unsent[peer].discard(key)
                    progress = True
                if waiting[r] or unsent[r]:
                    break
                if on_compute is not None:
                    for op in st.compute:
                        on_compute(r, pc[r], op)
                apply_compute(st.compute, bufs, combine)
                pc[r] += 1
                entered[r] = False
                progress = True
        if all(pc[r] == len(schedules[r].steps) for r in range(size)):
            break
        if not progress:
            lines = []
            for r in range(size):
                if pc[r] == len(schedules[r].steps):
                    continue
                recvs = ", ".join(f"from {p} tag {t}" for p, t in sorted(waiting[r]))
                sends = ", ".join(f"to {d} tag {t}" for _, d, t in sorted(unsent[r]))
                lines.append(f"  {where(r)}: waiting for recv [{recvs}] send [{sends}]")
            raise SimulationError("deadlock: no rank can make progress\n" + "\n".join(lines))
    if mailbox:
        left = ", ".join(f"{s} -> {d} tag {t} ({send})"
                         for (s, d, t), (_, send, _) in sorted(mailbox.items()))
        raise SimulationError(f"messages sent but never received: {left}")


def run(
    schedules: Sequence[Schedule],
    buffers: Sequence[Mapping[str, np.ndarray]],
    op: ReduceOp,
    *,
    rendezvous: bool = False,
) -> None:
    """Execute every rank's schedule; ``buffers[r]`` maps "in"/"out"/"tmp" to 1-D arrays.

    ``schedules[r]`` must be rank ``r``'s schedule of one collective call. Buffers are
    modified in place (at least the schedule's declared sizes; unused ones may be
    missing). Reduce applies ``op`` via :func:`minidist.ops.reduce_into`; ops.finish
    (AVG) is left to the caller, as in the real executor. Raises
    :class:`SimulationError` if the schedules are malformed or cannot complete.
    """
    op = ReduceOp(op)

    def combine(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        reduce_into(op, out, a, b)

    _execute(schedules, buffers, combine, rendezvous=rendezvous)


def _poison(dtype: np.dtype, n: int) -> np.ndarray:
    """Scratch contents that make reads of never-written elements show up in results."""
    if dtype.kind in "fc":
        return np.full(n, np.nan, dtype)
    if dtype.kind == "b":
        return np.ones(n, dtype)
    return np.full(n, np.iinfo(dtype).max // 3 + 7, dtype)


def simulate(
    collective: str,
    algorithm: str,
    inputs: Sequence[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    root: int = 0,
    *,
    rendezvous: bool = False,
) -> list[np.ndarray]:
    """Run ``collective`` with ``algorithm`` over ``len(inputs)`` virtual ranks.

    ``inputs[r]`` is rank ``r``'s data (any shape; flattened): the vector for
    all_reduce, broadcast and reduce; ``in`` for the others (``count * size``
    elements for reduce_scatter, all_to_all and the root's scatter input; ``count`` for
    all_gather and gather). For scatter only the root's input is read; barrier reads
    none. Inputs are not modified. In-place collectives start ``out`` as a copy of the
    input; other buffers and tmp start as "poison" (NaN, or an odd constant) so that
    reads of unwritten data show. AVG results are divided by ops.finish as the real
    executor does (all_reduce, reduce_scatter, and reduce on the root).

    Returns each rank's ``out`` as a new 1-D array (empty for ranks without one).
    Raises ValueError for inconsistent inputs, TypeError for an op the dtype lacks, and
    :class:`SimulationError` if the schedules misbehave.
    """
    size = len(inputs)
    if size < 1:
        raise ValueError("need at least one rank")
    if collective in ROOTED and not 0 <= root < size:
        raise ValueError(f"root {root} outside 0..{size - 1}")
    op = ReduceOp(op)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    ref = flat[root if collective in ROOTED else 0]
    dtype = ref.dtype
    if collective in REDUCING:
        check_op(op, dtype)
    if collective == "barrier":
        count = 0
    elif collective in ("reduce_scatter", "all_to_all", "scatter"):
        if ref.size % size:
            raise ValueError(f"{collective} input of {ref.size} elements is not "
                             f"a multiple of {size} ranks")
        count = ref.size // size
    else:
        count = ref.size
    schedules = [make_schedule(collective, algorithm, r, size, count, root)
                 for r in range(size)]
    buffers = []
    for r, s in enumerate(schedules):
        x = flat[r]
        uses_input = collective != "barrier" and (collective != "scatter" or r == root)
        if uses_input:
            if x.dtype != dtype:
                raise ValueError(f"rank {r} input is {x.dtype}, rank {root} input is {dtype}")
            want = s.out_size if collective in IN_PLACE else s.in_size
            if x.size != want:
                raise ValueError(f"rank {r} input has {x.size} elements, expected {want}")
        if collective in IN_PLACE:
            bufs = {"in": np.empty(0, dtype), "out": x.copy()}
        else:
            bufs = {"in": x.copy() if uses_input else np.empty(0, dtype),
                    "out": _poison(dtype, s.out_size)}
        if s.shared_tmp:  # one area for every rank, as shared memory is
            shared = buffers[0]["tmp"] if buffers else _poison(dtype, s.tmp_size)
            bufs["tmp"] = shared
        else:
            bufs["tmp"] = _poison(dtype, s.tmp_size)
        buffers.append(bufs)
    run(schedules, buffers, op, rendezvous=rendezvous)
    outs = [b["out"] for b in buffers]
    if collective in ("all_reduce", "reduce_scatter"):
        for o in outs:
            finish(op, o, size)
    elif collective == "reduce":
        finish(op, outs[root], size)
    return outs


@dataclass(frozen=True)
class OutWrite:
    """When a rank first wrote ``"out"``, and whose inputs it had heard from by then.

    ``known`` is the set of ranks whose input the data this rank had received (or holds
    itself) depends on, element by element, at the moment of the write.
    """

    rank: int
    step: int
    op: object
    known: frozenset[int]


def first_out_writes(
    schedules: Sequence[Schedule], *, rendezvous: bool = False
) -> list[OutWrite | None]:
    """Trace what each rank has heard and report its first non-empty write of ``"out"``.

    Runs the schedules over boolean "depends on rank j" masks instead of values: each
    element of a rank's input (``"in"``, or ``"out"`` for in-place collectives) depends on
    that rank; a Reduce depends on both operands; Copies and messages carry their
    dependencies along. ``known`` for rank ``r`` is ``{r}`` plus everything any message
    received so far (including the one being received into ``out``) depended on, plus
    everything its senders had heard when they sent it (the executor checks every
    frame's header, even an empty one's, before a rank goes on).
    ``None`` means the rank never wrote ``out``.
    """
    size = len(schedules)
    _check_group(schedules)
    in_place = schedules[0].collective in IN_PLACE
    buffers = []
    for r, s in enumerate(schedules):
        own = np.zeros(size, bool)
        own[r] = True
        b = {"in": np.tile(own, (s.in_size, 1)), "tmp": np.zeros((s.tmp_size, size), bool)}
        b["out"] = np.tile(own, (s.out_size, 1)) if in_place \
            else np.zeros((s.out_size, size), bool)
        buffers.append(b)
    heard = [{r} for r in range(size)]
    first: list[OutWrite | None] = [None] * size
    # every frame's header is checked on arrival, and a rank sends only after its own
    # checks passed: a message also vouches for everything its sender had heard
    vouched: dict[tuple[int, int, int], set[int]] = {}

    def on_send(r: int, step: int, send: Send) -> None:
        vouched[(r, send.peer, send.tag)] = set(heard[r])

    def on_recv(r: int, step: int, recv: Recv, data: np.ndarray) -> None:
        heard[r].update(int(j) for j in np.flatnonzero(data.any(axis=0)))
        heard[r].update(vouched.pop((recv.peer, r, recv.tag), ()))
        if recv.buf == "out" and recv.hi > recv.lo and first[r] is None:
            first[r] = OutWrite(r, step, recv, frozenset(heard[r]))

    def on_compute(r: int, step: int, op: Reduce | Copy) -> None:
        if op.dst == "out" and op.n > 0 and first[r] is None:
            first[r] = OutWrite(r, step, op, frozenset(heard[r]))

    def combine(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        np.logical_or(a, b, out=out)

    if schedules[0].shared_tmp:  # one area for every rank
        for b in buffers[1:]:
            b["tmp"] = buffers[0]["tmp"]
    _execute(schedules, buffers, combine, rendezvous=rendezvous,
             on_recv=on_recv, on_compute=on_compute, on_send=on_send)
    return first


def check_out_contract(schedules: Sequence[Schedule]) -> None:
    """Raise :class:`SimulationError` unless a reducing collective's schedules keep the
    "out untouched until everything is received" contract.

    Every rank's first write of ``"out"`` must come after it has received data that,
    together with its own input, depends on every rank's input (see
    :func:`first_out_writes`); for reduce, only the root may write ``"out"`` at all.
    Raises ValueError for collectives that do not reduce (the contract does not apply).
    """
    if not schedules or schedules[0].collective not in REDUCING:
        got = schedules[0].collective if schedules else None
        raise ValueError(f"the out contract applies to reducing collectives, not {got!r}")
    size = len(schedules)
    s0 = schedules[0]
    for w in first_out_writes(schedules):
        if w is None:
            continue
        if s0.collective == "reduce" and w.rank != s0.root:
            raise SimulationError(
                f"reduce/{s0.algorithm}: non-root rank {w.rank} writes out at step {w.step}: "
                f"{w.op}")
        if len(w.known) != size:
            missing = sorted(set(range(size)) - w.known)
            raise SimulationError(
                f"{s0.collective}/{s0.algorithm} rank {w.rank} writes out at step {w.step} "
                f"({w.op}) before hearing from ranks {missing}")

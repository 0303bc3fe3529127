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

from .. import collectives
from ..ops import ReduceOp, check_op, finish, identity, reduce_into
from .analysis import ScheduleError, stats, validate
from .registry import ALGORITHMS, COLLECTIVES, IN_PLACE, REDUCING, as_function, make_schedule
from .schedule import Copy, Recv, Reduce, Schedule, Send, apply_compute

__all__ = [
    "Failure", "OutWrite", "SimulationError", "VerifyReport", "check_out_contract",
    "default_counts", "expected", "first_out_writes", "run", "simulate", "stats", "verify",
]


class SimulationError(RuntimeError):
    """The schedules cannot run correctly together (or one breaks the contract).

    ``rank`` and ``step`` name the first place the trouble shows, when known."""

    def __init__(self, message: str, *, rank: int | None = None,
                 step: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.step = step


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
                f"schedule {r} is for rank {s.rank} of {s.size}, expected rank {r} of {size}",
                rank=r)
        key, want = ((s.collective, s.algorithm, s.count, s.root),
                     (first.collective, first.algorithm, first.count, first.root))
        if key != want:
            raise SimulationError(f"rank {r} runs {key}, rank 0 runs {want}", rank=r)
        if id(s) in _VALID and _VALID[id(s)] is s:
            continue
        try:
            validate(s)
        except ScheduleError as e:
            raise SimulationError(str(e), rank=r, step=e.step) from e
        if len(_VALID) >= 65536:
            _VALID.clear()
        _VALID[id(s)] = s


_VALID: dict[int, Schedule] = {}  # schedules already validated (kept alive, so ids hold)


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
                raise SimulationError(
                    f"rank {r}: buffer {name!r} needs {need} elements, got {got}", rank=r)

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
                                    f"{where(r)}: second message to rank {c.peer} with tag "
                                    f"{c.tag}", rank=r, step=pc[r])
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
                            f"{len(data)} elements, {where(r)} {c} expects {c.hi - c.lo}",
                            rank=r, step=pc[r])
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
            stuck = None
            for r in range(size):
                if pc[r] == len(schedules[r].steps):
                    continue
                stuck = r if stuck is None else stuck
                recvs = ", ".join(f"from {p} tag {t}" for p, t in sorted(waiting[r]))
                sends = ", ".join(f"to {d} tag {t}" for _, d, t in sorted(unsent[r]))
                lines.append(f"  {where(r)}: waiting for recv [{recvs}] send [{sends}]")
            raise SimulationError("deadlock: no rank can make progress\n" + "\n".join(lines),
                                  rank=stuck, step=None if stuck is None else pc[stuck])
    if mailbox:
        left = ", ".join(f"{s} -> {d} tag {t} ({send})"
                         for (s, d, t), (_, send, _) in sorted(mailbox.items()))
        (first_src, _, _), (_, _, first_step) = min(mailbox.items())
        raise SimulationError(f"messages sent but never received: {left}", rank=first_src,
                              step=first_step)


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
    algorithm: str | Callable[..., Schedule],
    inputs: Sequence[np.ndarray],
    op: ReduceOp = ReduceOp.SUM,
    root: int = 0,
    *,
    rendezvous: bool = False,
    nodes: tuple[int, ...] | None = None,
) -> list[np.ndarray]:
    """Run ``collective`` with ``algorithm`` over ``len(inputs)`` virtual ranks.

    ``algorithm`` is a name (built in or registered) or a schedule function of your own,
    ``fn(rank, size, count, root=0) -> Schedule``. ``inputs[r]`` is rank ``r``'s data
    (any shape; flattened): the vector for all_reduce, broadcast and reduce; ``in`` for
    the others (``count * size`` elements for reduce_scatter, all_to_all and the root's
    scatter input; ``count`` for all_gather and gather). For scatter only the root's
    input is read; barrier reads none. Inputs are not modified. In-place collectives
    start ``out`` as a copy of the input; other buffers and tmp start as "poison" (NaN,
    or an odd constant) so that reads of unwritten data show. AVG results are divided by
    ops.finish as the real executor does (all_reduce, reduce_scatter, and reduce on the
    root). ``nodes`` (the node of each rank) matters only for "hierarchical".

    Returns each rank's ``out`` as a new 1-D array (empty for ranks without one).
    Raises ValueError for inconsistent inputs or an unknown algorithm, TypeError for an
    op the dtype lacks, and :class:`SimulationError` if the schedules misbehave (a
    function of your own that returns a malformed schedule included).
    """
    schedules, buffers, op = _setup(collective, algorithm, inputs, op, root, nodes)
    run(schedules, buffers, op, rendezvous=rendezvous)
    return _outputs(collective, buffers, op, root)


def _setup(collective: str, algorithm: object, inputs: Sequence[np.ndarray], op: ReduceOp,
           root: int, nodes: tuple[int, ...] | None = None
           ) -> tuple[list[Schedule], list[dict[str, np.ndarray]], ReduceOp]:
    """Every rank's schedule and buffers for :func:`simulate`."""
    size = len(inputs)
    if size < 1:
        raise ValueError("need at least one rank")
    rec = collectives.get(collective)
    if rec.rooted and not 0 <= root < size:
        raise ValueError(f"root {root} outside 0..{size - 1}")
    op = ReduceOp(op)
    flat = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    ref = flat[root if rec.rooted else 0]
    dtype = ref.dtype
    if rec.reducing:
        check_op(op, dtype)
        if op.name in rec.refused_ops:
            raise ValueError(f"{collective} does not take {op.name}")
    count = rec.count_of(ref.size, size)
    try:
        schedules = [make_schedule(collective, algorithm, r, size, count, root, nodes=nodes,
                                   itemsize=dtype.itemsize) for r in range(size)]
    except ScheduleError as e:
        raise SimulationError(str(e), rank=e.rank, step=e.step) from e
    buffers = []
    for r, s in enumerate(schedules):
        x = flat[r]
        uses_input = rec.uses_input(r, root)
        if uses_input:
            if x.dtype != dtype:
                raise ValueError(f"rank {r} input is {x.dtype}, rank {root} input is {dtype}")
            want = s.out_size if rec.in_place else s.in_size
            if x.size != want:
                raise ValueError(f"rank {r} input has {x.size} elements, expected {want}")
        if rec.in_place:
            bufs = {"in": np.empty(0, dtype), "out": x.copy()}
        else:
            bufs = {"in": x.copy() if uses_input else np.empty(0, dtype),
                    "out": _poison(dtype, s.out_size)}
            if rec.identity_first and r == 0:  # as the planner gives it
                bufs["out"][:] = identity(op, dtype)
        if s.shared_tmp:  # one area for every rank, as shared memory is
            shared = buffers[0]["tmp"] if buffers else _poison(dtype, s.tmp_size)
            bufs["tmp"] = shared
        else:
            bufs["tmp"] = _poison(dtype, s.tmp_size)
        buffers.append(bufs)
    return schedules, buffers, op


def _outputs(collective: str, buffers: Sequence[Mapping[str, np.ndarray]], op: ReduceOp,
             root: int) -> list[np.ndarray]:
    rec = collectives.get(collective)
    outs = [b["out"] for b in buffers]
    for r, o in enumerate(outs):
        if rec.finishes(r, root):
            finish(op, o, len(outs))
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
                f"{w.op}", rank=w.rank, step=w.step)
        if len(w.known) != size:
            missing = sorted(set(range(size)) - w.known)
            raise SimulationError(
                f"{s0.collective}/{s0.algorithm} rank {w.rank} writes out at step {w.step} "
                f"({w.op}) before hearing from ranks {missing}", rank=w.rank, step=w.step)


# --------------------------------------------------------------------------- verify

_UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
    ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}


def expected(collective: str, inputs: Sequence[np.ndarray], op: ReduceOp = ReduceOp.SUM,
             root: int = 0) -> list[np.ndarray]:
    """What each rank's ``out`` must hold after the call, computed directly with numpy
    (inputs as for :func:`simulate`; reductions fold ranks in order 0, 1, ...)."""
    op = ReduceOp(op)
    n = len(inputs)
    flat = [np.asarray(x).reshape(-1) for x in inputs]

    def fold(parts: Sequence[np.ndarray]) -> np.ndarray:
        total = parts[0].copy()
        for x in parts[1:]:
            total = np.asarray(_UFUNC[op](total, x), parts[0].dtype)
        total = total.copy()
        finish(op, total, n)
        return total

    rec = collectives.get(collective)
    want = rec.expected(flat, fold, np.concatenate, root)
    if rec.identity_first and want and flat[0].size:
        want[0] = np.full(flat[0].size, identity(op, flat[0].dtype))
    return want


def default_counts(size: int) -> list[int]:
    """The counts :func:`verify` tries for ``size`` ranks: 0, 1, n-1, n, n+1, 3n+2 and
    2n+11 (empty, tiny, just under, at and over one element per rank, and uneven)."""
    return sorted({0, 1, size - 1, size, size + 1, 3 * size + 2, 2 * size + 11})


@dataclass(frozen=True)
class Failure:
    """The first case :func:`verify` found wrong: group size, count, root, and where
    (rank and step, None when it does not apply) and what (``kind``: "error" when the
    function raised, "schedule" for a malformed schedule, "run" when the schedules
    cannot run together, "result" for a wrong result, "contract" when a reducing
    collective writes ``out`` too early, "bits" when all_reduce's ranks disagree bit
    for bit)."""

    size: int
    count: int
    root: int
    rank: int | None
    step: int | None
    kind: str
    message: str

    def where(self) -> str:
        at = [f"N={self.size}", f"count={self.count}", f"root={self.root}"]
        if self.rank is not None:
            at.append(f"rank {self.rank}")
        if self.step is not None:
            at.append(f"step {self.step}")
        return ", ".join(at)

    def __str__(self) -> str:
        return f"{self.where()}: {self.message}"


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` found: true (``ok``) when every case held."""

    collective: str
    algorithm: str
    sizes: tuple[int, ...]
    cases: int
    failure: Failure | None

    @property
    def ok(self) -> bool:
        return self.failure is None

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        what = f"{self.collective}/{self.algorithm}"
        if self.failure is None:
            return f"{what}: holds for N = {_ranges(self.sizes)} ({self.cases} cases)"
        held = self.cases - 1
        return (f"{what}: FAILS at {self.failure.where()} ({self.failure.kind}; after "
                f"{held} case{'' if held == 1 else 's'} held)\n  {self.failure.message}")


def _ranges(values: Sequence[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out: list[str] = []
    vals = sorted(set(values))
    i = 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)


def verify(
    collective: str,
    algorithm: str | Callable[..., Schedule],
    sizes: Sequence[int] | range = range(1, 18),
    counts: Sequence[int] | Callable[[int], Sequence[int]] | None = None,
    roots: Sequence[int] | Callable[[int], Sequence[int]] | str | None = None,
    *,
    rendezvous: bool = True,
    contract: bool = True,
    bit_identical: bool = True,
    seed: int = 0,
) -> VerifyReport:
    """Check an algorithm (a name, or a schedule function of your own) in the simulator
    against numpy, for every group size in ``sizes``, every count and every root.

    ``counts``: a list for every size, a function of the size, or None for
    :func:`default_counts`. ``roots``: a list (roots outside the group are skipped), a
    function of the size, ``"all"``, or None (every root for rooted collectives, 0 for
    the others). Each case runs integer inputs (exact in any order) under rendezvous
    message semantics (a Send completes only when its Recv is posted: a schedule that
    passes cannot deadlock however the transport buffers), and checks:

    * every schedule is well formed and for the call asked (:func:`validate`);
    * the schedules run together: no deadlock, every message received, lengths agree;
    * every rank's ``out`` equals numpy's answer (:func:`expected`);
    * with ``contract``, reducing collectives write ``out`` only after hearing from
      every rank, and reduce's non-roots never (:func:`check_out_contract`);
    * with ``bit_identical``, all_reduce gives the same bits on every rank for float32
      inputs (ranks that round differently drift apart in training).

    Stops at the first failure and reports it (:class:`VerifyReport`, with a
    :class:`Failure` naming N, count, root, rank and step: for a wrong result, the step
    that last wrote the first wrong element).
    """
    if collective not in ALGORITHMS:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    name, _ = as_function(collective, algorithm)
    sizes = tuple(int(n) for n in sizes)
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be group sizes >= 1, not {sizes}")
    rng = np.random.default_rng(seed)
    cases = 0
    rec = collectives.get(collective)
    for size in sizes:
        if collective == "barrier":
            size_counts: Sequence[int] = [0]
        elif counts is None:
            size_counts = default_counts(size)
        else:
            size_counts = counts(size) if callable(counts) else counts
        if not rec.rooted:
            size_roots: Sequence[int] = [0]
        elif roots is None or roots == "all":
            size_roots = range(size)
        else:
            size_roots = roots(size) if callable(roots) else roots  # type: ignore[operator]
        for count in size_counts:
            for root in size_roots:
                if not 0 <= root < size:
                    continue
                cases += 1
                failure = _check_case(collective, algorithm, size, int(count), int(root),
                                      rng, rendezvous, contract, bit_identical)
                if failure is not None:
                    return VerifyReport(collective, name, sizes, cases, failure)
    return VerifyReport(collective, name, sizes, cases, None)


def _inputs(collective: str, size: int, count: int, rng: np.random.Generator,
            dtype: object) -> list[np.ndarray]:
    rec = collectives.get(collective)
    per_rank = count * size if rec.split else count
    if collective == "barrier":
        per_rank = 0
    if np.dtype(dtype).kind == "f":
        return [rng.standard_normal(per_rank).astype(dtype) for _ in range(size)]
    return [rng.integers(-1000, 1000, per_rank).astype(dtype) for _ in range(size)]


def _check_case(collective: str, algorithm: object, size: int, count: int, root: int,
                rng: np.random.Generator, rendezvous: bool, contract: bool,
                bit_identical: bool) -> Failure | None:
    def fail(kind: str, message: str, rank: int | None = None,
             step: int | None = None) -> Failure:
        return Failure(size, count, root, rank, step, kind, message)

    for r in range(size):  # build every schedule first: errors name the rank
        try:
            make_schedule(collective, algorithm, r, size, count, root)
        except ScheduleError as e:
            return fail("schedule", str(e), r, e.step)
        except Exception as e:  # noqa: BLE001 - a function of your own may raise anything
            return fail("error", f"building the schedule raised {type(e).__name__}: {e}", r)
    inputs = _inputs(collective, size, count, rng, np.int64)
    try:
        schedules, buffers, op = _setup(collective, algorithm, inputs, ReduceOp.SUM, root)
    except SimulationError as e:
        return fail("schedule", str(e), e.rank, e.step)
    except ValueError as e:
        return fail("schedule", str(e))
    writers = _Writers(schedules)
    try:
        _execute(schedules, buffers, _sum, rendezvous=rendezvous, on_recv=writers.on_recv,
                 on_compute=writers.on_compute)
    except SimulationError as e:
        return fail("run", str(e), e.rank, e.step)
    got = _outputs(collective, buffers, op, root)
    want = expected(collective, inputs, ReduceOp.SUM, root)
    for r, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape:
            return fail("result", f"rank {r} has {g.size} output elements, expected {w.size}",
                        r)
        bad = np.flatnonzero(g != w)
        if bad.size:
            i = int(bad[0])
            step, why = writers.last(r, i)
            return fail("result", f"rank {r} out[{i}] = {g[i]}, expected {w[i]} "
                        f"({bad.size} wrong element{'s' if bad.size > 1 else ''}); {why}",
                        r, step)
    if contract and collectives.get(collective).reducing and \
            collectives.get(collective).contract and size > 1:
        try:
            check_out_contract(schedules)
        except SimulationError as e:
            return fail("contract", str(e), e.rank, e.step)
    if bit_identical and collective == "all_reduce" and size > 1 and count > 0 \
            and count in (size + 1, 3 * size + 2, 2 * size + 11):
        floats = _inputs(collective, size, count, rng, np.float32)
        schedules, buffers, op = _setup(collective, algorithm, floats, ReduceOp.SUM, root)
        writers = _Writers(schedules)
        _execute(schedules, buffers, _sum, rendezvous=rendezvous, on_recv=writers.on_recv,
                 on_compute=writers.on_compute)
        outs = [b["out"] for b in buffers]
        first = outs[0].view(np.uint32)
        for r in range(1, size):
            bad = np.flatnonzero(outs[r].view(np.uint32) != first)
            if bad.size:
                i = int(bad[0])
                step, why = writers.last(r, i)
                return fail("bits", f"rank {r} out[{i}] = {outs[r][i]!r} but rank 0 has "
                            f"{outs[0][i]!r} (float32 sums in another order); {why}", r, step)
    return None


def _sum(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.add(a, b, out=out)


class _Writers:
    """Which step (and op) last wrote each element of each rank's ``out``."""

    def __init__(self, schedules: Sequence[Schedule]) -> None:
        self.step = [np.full(s.out_size, -1, np.int64) for s in schedules]
        self.op = [np.full(s.out_size, -1, np.int64) for s in schedules]
        self.ops: list[list[object]] = [[] for _ in schedules]

    def _mark(self, r: int, step: int, op: object, lo: int, n: int) -> None:
        self.step[r][lo:lo + n] = step
        self.op[r][lo:lo + n] = len(self.ops[r])
        self.ops[r].append(op)

    def on_recv(self, r: int, step: int, recv: Recv, data: np.ndarray) -> None:
        if recv.buf == "out":
            self._mark(r, step, recv, recv.lo, recv.hi - recv.lo)

    def on_compute(self, r: int, step: int, op: Reduce | Copy) -> None:
        if op.dst == "out":
            self._mark(r, step, op, op.dst_lo, op.n)

    def last(self, r: int, i: int) -> tuple[int | None, str]:
        if i >= len(self.step[r]) or self.step[r][i] < 0:
            return None, "the schedule never writes it"
        step = int(self.step[r][i])
        return step, f"last written at step {step} by {self.ops[r][int(self.op[r][i])]}"

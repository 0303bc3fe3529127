"""What collective calls cost: a replay of the schedules themselves, and the all_reduce
chooser built on it (pure: no I/O).

**The replay** (:func:`replay`) runs every rank's schedule in virtual time on a model
machine and says when each rank finishes. The model:

* a message of ``b`` bytes costs ``alpha_s + b * beta_s`` of CPU, half on the sender
  (writing it) and half on the receiver (reading it, once it has arrived); between
  nodes it also crosses the sending node's network link, which carries one message at
  a time: ``b * beta_n`` on the link, plus ``alpha_n`` of latency;
* reducing ``b`` bytes costs ``b * gamma`` of CPU, copying them ``b * delta``, and
  every such operation (a Reduce or a Copy: one numpy call) ``sigma`` more, so that
  many small copies (Bruck's packing and rotations) cost what they do;
* each rank does its work in order, as the executor does: a step's sends, then its
  receives in the order they arrive, then its computations; a rank waits for a
  message only when it has nothing else to do;
* each node has ``cores`` cores shared by its ranks: a rank ready to work waits for a
  free core (first come, first served).

A call takes as long as its slowest rank. With a core per rank this reduces to the
critical path of the alpha-beta(-gamma) model; with many ranks per core it shows the
total work: the model needs no separate formula per algorithm, and works for every
collective and for algorithms of your own.

**The choosers** predict each candidate algorithm with the replay (memoized; very
large schedules fall back to closed forms) and take the least; equal predictions go to
the algorithm that sends fewer messages, then to the first listed. :func:`choose` picks
one node's all_reduce (:func:`predict` prunes the candidates first);
:func:`choose_replayed` any collective's, from its schedules alone (the planner uses it
for all_to_all: Bruck for small blocks, pairwise for large ones).

The parameters come from ``minidist calibrate`` (saved per machine) or the defaults
below, measured on a 2-core machine like the project's.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .. import collectives
from . import shm
from .registry import make_schedule, schedules
from .schedule import Reduce, Schedule, Send


@dataclass(frozen=True)
class Costs:
    """The model's parameters (seconds per message and per byte) and the node's cores.

    ``alpha_s``/``beta_s``: a message over a socket inside a node (per message, per
    byte). ``alpha_m``/``beta_m``: the shared-memory all_reduce's closed form (one
    barrier round; copies and reduction per byte of the vector). ``gamma``/``delta``:
    reducing / copying one byte; ``sigma``: the fixed cost of one such local operation
    (a numpy call). ``alpha_n``/``beta_n``: a message between nodes (latency, per byte
    on the link). ``cores``: cores per node.
    """

    alpha_s: float = 40e-6
    beta_s: float = 0.4e-9
    alpha_m: float = 90e-6
    beta_m: float = 0.42e-9
    cores: int = 2
    gamma: float = 0.085e-9
    delta: float = 0.165e-9
    alpha_n: float = 50e-6
    beta_n: float = 0.8e-9
    sigma: float = 1.0e-6
    call_s: float = 77e-6

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT = Costs()
CANDIDATES = ("recursive_doubling", "tree", "ring", "shared_memory")
REPLAY_MAX_OPS = 60_000
"""The chooser replays a candidate only when its schedules hold at most this many
operations over all ranks (about 0.1 s of replay); larger ones use :func:`predict`."""


# --------------------------------------------------------------------------- the replay


@dataclass(frozen=True)
class Event:
    """One piece of a rank's work in the replay (seconds from the start of the call)."""

    rank: int
    step: int
    kind: str  # "send", "recv", "reduce", "copy"
    start: float
    end: float
    peer: int = -1
    tag: int = -1
    nbytes: int = 0
    detail: str = ""


@dataclass(frozen=True)
class Message:
    """One message in the replay: sent (end of the send), arrived, and taken in (start
    of the receive)."""

    src: int
    dst: int
    tag: int
    nbytes: int
    sent: float
    arrived: float
    taken: float


@dataclass(frozen=True)
class Replay:
    """The replay of one call: ``time`` (seconds, the last rank's finish), each rank's
    ``finish`` and ``busy`` (CPU seconds), the number of ``messages`` and the bytes
    sent (``nbytes``), the bytes reduced and copied; with ``record``, every
    :class:`Event` and :class:`Message`."""

    time: float
    finish: tuple[float, ...]
    busy: tuple[float, ...]
    messages: int
    nbytes: int
    reduced: int
    copied: int
    events: tuple[Event, ...] = field(default=(), repr=False)
    flows: tuple[Message, ...] = field(default=(), repr=False)


def replay(schedules: Sequence[Schedule], c: Costs = DEFAULT, itemsize: int = 4,
           nodes: Sequence[int] | None = None, *, record: bool = False) -> Replay:
    """Replay one call: ``schedules[r]`` is rank ``r``'s schedule, elements are
    ``itemsize`` bytes, ``nodes[r]`` the node of rank ``r`` (default: all on one).

    Raises ValueError when the schedules cannot complete (a receive nobody sends: run
    the simulator for the details).
    """
    n = len(schedules)
    node = tuple(nodes) if nodes is not None else (0,) * n
    if len(node) != n:
        raise ValueError(f"nodes gives {len(node)} nodes for {n} ranks")
    cores = max(1, int(c.cores))
    free = {nd: [0.0] * cores for nd in set(node)}  # each node's cores: when free
    link = dict.fromkeys(set(node), 0.0)  # each node's network link: when free
    steps = [s.steps for s in schedules]
    steps_of = [bool(st) for st in steps]
    pc = [0] * n
    stage = [0] * n  # 0 sends, 1 receives, 2 compute
    nsent = [0] * n
    pending: list[dict[tuple[int, int], int]] = [{} for _ in range(n)]
    arrived: dict[tuple[int, int, int], tuple[float, float]] = {}  # -> (sent, arrival)
    blocked = [False] * n
    version = [0] * n
    finish = [0.0] * n
    busy = [0.0] * n
    events: list[Event] = []
    flows: list[Message] = []
    totals = {"messages": 0, "bytes": 0, "reduced": 0, "copied": 0}
    half_a = c.alpha_s / 2
    half_b = c.beta_s / 2

    def work(r: int, t: float, d: float) -> float:
        """Run ``d`` seconds of rank r's work from time t on a core of its node."""
        cs = free[node[r]]
        start = max(t, heapq.heappop(cs))
        heapq.heappush(cs, start + d)
        busy[r] += d
        return start

    # every rank first spends call_s on the call itself (planning, handing it over)
    heap: list[tuple[float, int, int]] = [
        ((work(r, 0.0, c.call_s) + c.call_s) if c.call_s > 0 and steps_of[r] else 0.0, r, 0)
        for r in range(n)]
    heapq.heapify(heap)

    def wake(r: int, t: float) -> None:
        version[r] += 1
        heapq.heappush(heap, (t, r, version[r]))

    while heap:
        t, r, v = heapq.heappop(heap)
        if v != version[r]:
            continue
        while True:
            if pc[r] == len(steps[r]):
                finish[r] = t
                break
            st = steps[r][pc[r]]
            if stage[r] == 0:
                sends = [x for x in st.comms if isinstance(x, Send)]
                if nsent[r] < len(sends):
                    s = sends[nsent[r]]
                    nsent[r] += 1
                    b = (s.hi - s.lo) * itemsize
                    d = half_a + b * half_b
                    start = work(r, t, d)
                    end = start + d
                    if node[s.peer] == node[r]:
                        arrival = end
                    else:
                        on_link = max(end, link[node[r]])
                        link[node[r]] = on_link + b * c.beta_n
                        arrival = on_link + b * c.beta_n + c.alpha_n
                    arrived[(r, s.peer, s.tag)] = (end, arrival)
                    totals["messages"] += 1
                    totals["bytes"] += b
                    if record:
                        events.append(Event(r, pc[r], "send", start, end, s.peer, s.tag, b,
                                            f"{s.buf}[{s.lo}:{s.hi}]"))
                    if blocked[s.peer]:
                        blocked[s.peer] = False
                        wake(s.peer, max(arrival, finish[s.peer]))
                    wake(r, end)
                    break
                stage[r] = 1
                nsent[r] = 0
                pending[r] = {(x.peer, x.tag): (x.hi - x.lo) * itemsize for x in st.comms
                              if not isinstance(x, Send)}
                continue
            if stage[r] == 1:
                if not pending[r]:
                    stage[r] = 2
                    continue
                best = None
                for (peer, tag) in pending[r]:
                    got = arrived.get((peer, r, tag))
                    if got is not None and (best is None or got[1] < best[0]):
                        best = (got[1], peer, tag, got[0])
                if best is None:
                    blocked[r] = True
                    finish[r] = t  # the time it started waiting
                    break
                arrival, peer, tag, sent_at = best
                if arrival > t:
                    wake(r, arrival)
                    break
                b = pending[r].pop((peer, tag))
                del arrived[(peer, r, tag)]
                d = half_a + b * half_b
                start = work(r, t, d)
                if record:
                    recv = next(x for x in st.comms if not isinstance(x, Send)
                                and x.peer == peer and x.tag == tag)
                    events.append(Event(r, pc[r], "recv", start, start + d, peer, tag, b,
                                        f"{recv.buf}[{recv.lo}:{recv.hi}]"))
                    flows.append(Message(peer, r, tag, b, sent_at, arrival, start))
                wake(r, start + d)
                break
            # stage 2: the step's computations, then the next step
            nreduce = sum(1 for op in st.compute if isinstance(op, Reduce) and op.n)
            ncopy = sum(1 for op in st.compute if not isinstance(op, Reduce) and op.n)
            reduced = sum(op.n for op in st.compute if isinstance(op, Reduce)) * itemsize
            copied = sum(op.n for op in st.compute if not isinstance(op, Reduce)) * itemsize
            totals["reduced"] += reduced
            totals["copied"] += copied
            pc[r] += 1
            stage[r] = 0
            d_reduce = reduced * c.gamma + nreduce * c.sigma
            d = d_reduce + copied * c.delta + ncopy * c.sigma
            if d > 0:
                start = work(r, t, d)
                if record:
                    if reduced:
                        events.append(Event(r, pc[r] - 1, "reduce", start,
                                            start + d_reduce, nbytes=reduced))
                    if copied:
                        events.append(Event(r, pc[r] - 1, "copy", start + d_reduce,
                                            start + d, nbytes=copied))
                wake(r, start + d)
                break
    stuck = [r for r in range(n) if pc[r] < len(steps[r])]
    if stuck:
        r = stuck[0]
        raise ValueError(f"the schedules cannot complete: rank {r} waits at step {pc[r]} "
                         f"for {sorted(pending[r])} (peer, tag)")
    return Replay(max(finish, default=0.0), tuple(finish), tuple(busy), totals["messages"],
                  totals["bytes"], totals["reduced"], totals["copied"], tuple(events),
                  tuple(flows))


def replay_call(collective: str, algorithm: object, size: int, count: int, c: Costs = DEFAULT,
                *, itemsize: int = 4, root: int = 0, nodes: Sequence[int] | None = None,
                record: bool = False) -> Replay:
    """:func:`replay` of ``algorithm`` (a name or a schedule function) for ``size``
    ranks and ``count`` elements (as in :func:`~minidist.algorithms.make_schedule`)."""
    layout = tuple(nodes) if nodes is not None else None
    scheds = schedules(collective, algorithm, size, count, root, nodes=layout,
                       itemsize=itemsize)
    return replay(scheds, c, itemsize, layout, record=record)


# --------------------------------------------------------------------------- lower bounds


def lower_bounds(collective: str, n: int, nbytes: int, c: Costs = DEFAULT
                 ) -> dict[str, float]:
    """Lower bounds on a call's time with a core per rank, under the replay's model:
    ``latency`` = ceil(log2 n) * alpha_s (information must reach every rank, doubling
    at best each round); ``bandwidth`` (beta_s times what the busiest rank must at
    least send and receive, half each way, as the collective's record in
    :mod:`minidist.collectives` says): 2(n-1)/n N for all_reduce, (n-1)/n N for
    all_gather, reduce_scatter and all_to_all, (n-1)/n N / 2 for gather and scatter
    (only the root), N / 2 for broadcast and reduce; ``compute`` = (n-1)/n N gamma for
    the collectives that reduce a share of the vector; ``call`` = call_s, what every
    rank spends on the call itself. ``bound`` is call plus the larger of latency and
    bandwidth + compute. ``nbytes`` (N) is the whole vector, as for :func:`choose`."""
    if n <= 1:
        return {"latency": 0.0, "bandwidth": 0.0, "compute": 0.0, "call": 0.0, "bound": 0.0}
    rec = collectives.get(collective)
    N = float(nbytes)
    share = (n - 1) / n * N
    moved = rec.moved(n, N)
    latency = math.ceil(math.log2(n)) * c.alpha_s
    bandwidth = moved * c.beta_s
    compute = share * c.gamma if rec.computes else 0.0
    return {"latency": latency, "bandwidth": bandwidth, "compute": compute,
            "call": c.call_s, "bound": c.call_s + max(latency, bandwidth + compute)}


# --------------------------------------------------------------------------- closed forms


def predict(algorithm: str, n: int, nbytes: int, c: Costs = DEFAULT,
            chunk_bytes: int = 2 << 20) -> float:
    """Closed-form seconds of an all_reduce of ``nbytes`` over ``n`` ranks of one node
    (inf for an unknown algorithm, or a ring with fewer bytes than ranks): the larger of
    the critical path and all ranks' work divided by the cores (see docs/algorithms.md).
    Quick, rougher than :func:`replay`; the chooser uses it only for schedules too
    large to replay."""
    if n <= 1:
        return 0.0
    L = math.ceil(math.log2(n))
    N = float(nbytes)
    a, b = c.alpha_s, c.beta_s
    if algorithm == "recursive_doubling":
        critical, work = L * (a + N * b), n * L * (a + N * b)
    elif algorithm == "tree":
        critical, work = 2 * L * (a + N * b), 2 * (n - 1) * (a + N * b)
    elif algorithm == "ring":
        if nbytes < n:
            return math.inf
        critical, work = 2 * (n - 1) * (a + N / n * b), 2 * (n - 1) * (n * a + N * b)
    elif algorithm == "shared_memory":
        k = max(1, math.ceil(N / max(1, chunk_bytes)))
        critical = (k + 1) * L * c.alpha_m + N * c.beta_m
        work = (k + 1) * n * L * c.alpha_m + n * N * c.beta_m
    else:
        return math.inf
    # every rank first spends call_s on the call itself
    return max(c.call_s + critical, (n * c.call_s + work) / max(1, c.cores))


# --------------------------------------------------------------------------- the chooser


def _ops_estimate(algorithm: str, n: int, count: int, chunk: int) -> int:
    """About how many operations the all_reduce schedules of ``n`` ranks hold."""
    L = max(1, math.ceil(math.log2(max(2, n))))
    if algorithm == "ring":
        per_rank = 6 * (n - 1)
    elif algorithm == "shared_memory":
        per_rank = (math.ceil(max(1, count) / max(1, chunk)) + 1) * (3 * n + 2 * L)
    else:
        per_rank = 4 * L + 4
    return per_rank * n


@functools.lru_cache(maxsize=1024)
def _replayed(algorithm: str, n: int, count: int, itemsize: int, c: Costs,
              chunk: int) -> tuple[float, int]:
    """(seconds, messages) of a one-node all_reduce by replay (memoized)."""

    if algorithm == "shared_memory":
        scheds = [shm.shared_memory(r, n, count, chunk) for r in range(n)]
    else:
        scheds = [make_schedule("all_reduce", algorithm, r, n, count, keep=False)
                  for r in range(n)]
    result = replay(scheds, c, itemsize)
    return result.time, result.messages


def estimate(algorithm: str, n: int, nbytes: int, c: Costs = DEFAULT,
             chunk_bytes: int = 2 << 20, *, itemsize: int = 4) -> float:
    """Predicted seconds of a one-node all_reduce of ``nbytes`` over ``n`` ranks: the
    replay of its schedules (memoized), or :func:`predict` when they are larger than
    :data:`REPLAY_MAX_OPS`. inf for an unknown algorithm or a ring with fewer elements
    than ranks."""
    return _estimate(algorithm, n, nbytes, c, chunk_bytes, itemsize)[0]


def _estimate(algorithm: str, n: int, nbytes: int, c: Costs, chunk_bytes: int,
              itemsize: int) -> tuple[float, float]:
    if n <= 1:
        return 0.0, 0.0
    if algorithm not in CANDIDATES:
        return math.inf, math.inf
    count = nbytes // max(1, itemsize)
    if algorithm == "ring" and count < n:
        return math.inf, math.inf
    chunk = max(1, chunk_bytes // max(1, itemsize))
    if _ops_estimate(algorithm, n, count, chunk) > REPLAY_MAX_OPS:
        return predict(algorithm, n, nbytes, c, chunk_bytes), math.inf
    seconds, messages = _replayed(algorithm, n, count, itemsize, c, chunk)
    return seconds, messages


PRUNE = 2.0
"""The chooser replays only the candidates whose closed form (:func:`predict`) is
within this factor of the best closed form; the others cannot be close."""


def choose(n: int, nbytes: int, c: Costs = DEFAULT, chunk_bytes: int = 2 << 20,
           candidates: tuple[str, ...] = CANDIDATES, *, itemsize: int = 4) -> str:
    """The candidate with the least predicted time (:func:`estimate`); equal
    predictions (within one part in a million) go to the one that sends fewer messages,
    then to the first listed. Candidates whose closed form is more than :data:`PRUNE`
    times the best one's are not replayed. The same on every rank of a node (same
    calibration)."""
    rough = {a: predict(a, n, nbytes, c, chunk_bytes) for a in candidates}
    floor = min(rough.values(), default=math.inf)
    kept = [a for a in candidates if rough[a] <= PRUNE * floor] or list(candidates)
    if len(kept) == 1:
        return kept[0]
    scored = [(_estimate(a, n, nbytes, c, chunk_bytes, itemsize), i, a)
              for i, a in enumerate(kept)]
    best = min(t for (t, _), _, _ in scored)
    tied = [(messages, i, a) for (t, messages), i, a in scored
            if t <= best * (1 + 1e-6) + 1e-15]
    return min(tied)[2]


# --------------------------------------------------------------------------- any collective

ALL_TO_ALL_CANDIDATES = ("pairwise", "bruck")
"""What the planner chooses from for an all_to_all (:func:`choose_replayed`)."""


REPLAY_QUICK_OPS = 4_000
"""Where a closed form gives the replay's answer (all_to_all on one node: every rank
does the same work, so the replay's time is the cores' work), :func:`choose_replayed`
replays only schedules of at most this many operations (a few milliseconds)."""


def predict_all_to_all(algorithm: str, n: int, count: int, c: Costs = DEFAULT,
                       itemsize: int = 4) -> float:
    """Closed-form seconds of a one-node all_to_all of ``count`` elements per block
    (each rank sends ``n - 1`` blocks): the larger of the critical path and all ranks'
    work over the cores, as :func:`predict` (inf for another algorithm). The chooser
    uses it only for schedules too large to replay.

    pairwise: ``n - 1`` messages of one block, one block copied; Bruck: ``ceil(log2 n)``
    messages, round ``k`` with the blocks whose position has bit ``k`` set, packed and
    unpacked a run of neighbouring blocks at a time (a copy each), plus the rotation in
    (two copies) and the ``n`` copies out. Exact (the replay's answer) when the ranks'
    work divides evenly among the cores."""
    if n <= 1:
        return 0.0
    b = count * itemsize
    if algorithm == "pairwise":
        per_rank = c.call_s + (n - 1) * (c.alpha_s + b * c.beta_s) + b * c.delta + c.sigma
    elif algorithm == "bruck":
        ds = [1 << k for k in range((n - 1).bit_length())]
        moved = [sum(1 for i in range(n) if i & d) for d in ds]
        runs = [(n + d - 1) // (2 * d) for d in ds]  # the copies that pack a round
        per_rank = (c.call_s + len(moved) * c.alpha_s + sum(moved) * b * c.beta_s
                    + (2 * sum(moved) + 2 * n) * b * c.delta
                    + (2 * sum(runs) + n + 2) * c.sigma)
    else:
        return math.inf
    return max(per_rank, n * per_rank / max(1, c.cores))


def _schedule_ops(collective: str, algorithm: str, n: int, count: int) -> int:
    """About how many operations the schedules of one call hold: rank 0's times ``n``
    (rank 0's schedule only is built: cheap even for thousands of ranks)."""
    s = make_schedule(collective, algorithm, 0, n, count, keep=False)  # (rank 0's: not
    return n * sum(len(st.comms) + len(st.compute) for st in s.steps)  # this rank's)


@functools.lru_cache(maxsize=1024)
def _replayed_call(collective: str, algorithm: str, n: int, count: int, itemsize: int,
                   c: Costs, nodes: tuple[int, ...] | None) -> tuple[float, float]:
    """(seconds, messages) of one call by replay, or by closed form when its schedules
    are larger than :data:`REPLAY_MAX_OPS` (memoized)."""
    if n <= 1:
        return 0.0, 0.0
    ops = _schedule_ops(collective, algorithm, n, count)
    closed = (collective == "all_to_all" and nodes is None
              and algorithm in ALL_TO_ALL_CANDIDATES)
    if ops > (REPLAY_QUICK_OPS if closed else REPLAY_MAX_OPS):
        if closed:
            return predict_all_to_all(algorithm, n, count, c, itemsize), math.inf
        return math.inf, math.inf
    result = replay_call(collective, algorithm, n, count, c, itemsize=itemsize, nodes=nodes)
    return result.time, result.messages


def choose_replayed(collective: str, n: int, count: int, c: Costs = DEFAULT,
                    candidates: Sequence[str] = ALL_TO_ALL_CANDIDATES, *, itemsize: int = 4,
                    nodes: Sequence[int] | None = None) -> str:
    """The candidate (registered names of ``collective``) with the least replayed time
    for ``n`` ranks and ``count`` elements (as :func:`~minidist.algorithms.make_schedule`
    counts them; ``nodes``: the node of each rank, default one node); equal predictions
    (within one part in a million) go to the one that sends fewer messages, then to the
    first listed. Schedules too large to replay use a closed form where there is one
    (all_to_all on one node), else count as infinitely slow; if every candidate does,
    the first listed wins. Pure and memoized: the same answer on every rank that has
    the same calibration."""
    if not candidates:
        raise ValueError("choose_replayed needs at least one candidate")
    layout = tuple(nodes) if nodes is not None and len(set(nodes)) > 1 else None
    scored = [(_replayed_call(collective, a, n, count, itemsize, c, layout), i, a)
              for i, a in enumerate(candidates)]
    best = min(t for (t, _), _, _ in scored)
    if math.isinf(best):
        return candidates[0]
    tied = [(messages, i, a) for (t, messages), i, a in scored
            if t <= best * (1 + 1e-6) + 1e-15]
    return min(tied)[2]

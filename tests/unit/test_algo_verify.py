"""verify(): the first failing N, count, root, rank and step of an algorithm of your
own, for each way an algorithm can be wrong; and compose()."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from minidist.algorithms import (
    PHASE_TAGS,
    Copy,
    Part,
    Recv,
    Reduce,
    Schedule,
    Send,
    Step,
    build,
    compose,
    make_schedule,
    part,
    verify,
)
from minidist.algorithms.simulator import default_counts, expected, simulate

pytestmark = pytest.mark.timeout(120)


def test_a_correct_algorithm_holds():
    report = verify("all_reduce", "ring", range(1, 9))
    assert report.ok and bool(report) and report.failure is None
    assert report.cases == sum(len(default_counts(n)) for n in range(1, 9))
    assert str(report) == f"all_reduce/ring: holds for N = 1-8 ({report.cases} cases)"


def test_every_root_of_a_rooted_collective_is_tried():
    report = verify("broadcast", "binomial", [5], counts=[3])
    assert report.ok and report.cases == 5
    assert verify("broadcast", "binomial", [5], counts=[3], roots=[1, 9]).cases == 1


def dropped_reduce(rank, size, count, root=0):
    """The ring, with rank 3 of 6 skipping its reduction at step 2 when count is 7."""
    s = make_schedule("all_reduce", "ring", rank, size, count)
    if (size, rank, count) == (6, 3, 7):
        steps = list(s.steps)
        steps[2] = Step(steps[2].comms, ())
        s = dataclasses.replace(s, steps=tuple(steps))
    return s


def test_a_wrong_result_names_size_count_rank_and_the_step_that_wrote_it():
    report = verify("all_reduce", dropped_reduce, range(1, 10))
    f = report.failure
    assert not report and f is not None
    assert (f.size, f.count, f.root, f.kind) == (6, 7, 0, "result")
    assert f.rank is not None and f.step is not None
    assert f"last written at step {f.step}" in f.message
    text = str(report)
    assert text.startswith("all_reduce/dropped_reduce: FAILS at N=6, count=7, root=0, rank")


def swap_add(rank, size, count, root=0):
    """Send in one step, receive in the next: deadlocks when a send waits for its recv."""
    peer = (rank + 1) % size
    steps = [Step((Send(peer, 0, "out", 0, count),)),
             Step((Recv((rank - 1) % size, 0, "tmp", 0, count),),
                  (Reduce("out", 0, "out", 0, "tmp", 0, count),))] if size > 1 else []
    return build("all_reduce", "swap_add", rank, size, count, 0, steps)


def test_a_deadlock_is_found_under_rendezvous_semantics():
    f = verify("all_reduce", swap_add, [2]).failure
    assert f is not None and f.kind == "run" and "deadlock" in f.message
    assert (f.size, f.rank, f.step) == (2, 0, 0)


def early_out(rank, size, count, root=0):
    """Recursive doubling that writes out as soon as it hears from its first partner."""
    if size != 4:
        return make_schedule("all_reduce", "recursive_doubling", rank, size, count)
    steps = []
    for k in range(2):
        partner = rank ^ (1 << k)
        steps.append(Step((Send(partner, k, "out", 0, count),
                           Recv(partner, k, "tmp", 0, count)),
                          (Reduce("out", 0, "out", 0, "tmp", 0, count),)))
    return build("all_reduce", "early_out", rank, size, count, 0, steps)


def test_writing_out_before_hearing_from_everyone_breaks_the_contract():
    f = verify("all_reduce", early_out, [4], bit_identical=False).failure
    assert f is not None and f.kind == "contract" and (f.rank, f.step) == (0, 0)
    assert "before hearing from ranks [2, 3]" in f.message
    assert verify("all_reduce", early_out, [4], contract=False, bit_identical=False).ok


def own_first(rank, size, count, root=0):
    """Every rank gets every vector and sums them starting from its own: the sums
    associate differently on different ranks, so they round differently."""
    n, c = size, count
    comms = [Send(j, 0, "out", 0, c) for j in range(n) if j != rank]
    comms += [Recv(j, 0, "tmp", j * c, (j + 1) * c) for j in range(n) if j != rank]
    acc = n * c
    compute = [Copy("tmp", acc, "out", 0, c)]
    compute += [Reduce("tmp", acc, "tmp", acc, "tmp", ((rank + i) % n) * c, c)
                for i in range(1, n)]
    compute.append(Copy("out", 0, "tmp", acc, c))
    return build("all_reduce", "own_first", rank, n, c, 0, [Step(tuple(comms), tuple(compute))])


def test_ranks_that_round_differently_are_found():
    report = verify("all_reduce", own_first, [5, 8])
    f = report.failure
    assert f is not None and f.kind == "bits" and f.rank is not None and f.rank > 0
    assert "another order" in f.message
    assert verify("all_reduce", own_first, [5, 8], bit_identical=False).ok


def raises(rank, size, count, root=0):
    if size == 3 and rank == 2:
        raise IndexError("list index out of range")
    return make_schedule("all_reduce", "ring", rank, size, count)


def test_an_exception_names_the_rank():
    f = verify("all_reduce", raises, range(1, 5)).failure
    assert f is not None and (f.kind, f.size, f.count, f.rank) == ("error", 3, 0, 2)
    assert "IndexError" in f.message


def out_of_bounds(rank, size, count, root=0):
    s = make_schedule("all_reduce", "ring", rank, size, count)
    if size == 4 and count == 5:
        first = s.steps[0]
        return dataclasses.replace(s, tmp_size=0, steps=(first, *s.steps[1:]))
    return s


def test_a_malformed_schedule_names_rank_and_step():
    f = verify("all_reduce", out_of_bounds, range(1, 6)).failure
    assert f is not None and f.kind == "schedule" and (f.size, f.count) == (4, 5)
    assert f.rank == 0 and f.step == 0 and "out of range" in f.message


def test_expected_answers():
    x = [np.arange(4) + r for r in range(2)]
    assert np.array_equal(expected("all_reduce", x)[1], np.array([1, 3, 5, 7]))
    assert np.array_equal(expected("all_gather", x)[0], np.concatenate(x))
    assert np.array_equal(expected("reduce_scatter", x)[1], np.array([5, 7]))
    assert np.array_equal(expected("all_to_all", x)[0], np.array([0, 1, 1, 2]))


# --------------------------------------------------------------------------- compose


def reduce_then_broadcast(rank, size, count, root=0):
    """all_reduce as a binomial reduce to rank 0, then a pipelined broadcast."""
    everyone = range(size)
    return compose("all_reduce", "reduce_then_broadcast", rank, size, count, 0, [
        part("reduce", "binomial", everyone, rank, count, root=0),
        part("broadcast", "pipeline", everyone, rank, count, root=0),
    ])


def grid(rank, size, count, root=0):
    """A 2D all_reduce: along rows of 3, then along columns, all in tmp."""
    width = 3 if size % 3 == 0 else 1
    row = [r for r in range(size) if r // width == rank // width]
    col = [r for r in range(size) if r % width == rank % width]
    bufs = {"out": ("tmp", 0), "tmp": ("tmp", count)}
    return compose("all_reduce", "grid", rank, size, count, 0, [
        Step(compute=(Copy("tmp", 0, "out", 0, count),)),
        part("all_reduce", "ring", row, rank, count, buffers=bufs),
        part("all_reduce", "recursive_doubling", col, rank, count, buffers=bufs),
        Step(compute=(Copy("out", 0, "tmp", 0, count),)),
    ])


@pytest.mark.parametrize("fn", [reduce_then_broadcast, grid])
def test_composed_algorithms_hold(fn):
    report = verify("all_reduce", fn, range(1, 13))
    assert report.ok, str(report)


def test_parts_remap_ranks_tags_and_buffers():
    s = grid(4, 6, 10)
    assert s.tmp_size >= 10 + 4  # the vector plus the ring's scratch
    phases = {c.tag // PHASE_TAGS for st in s.steps for c in st.comms}
    assert phases == {1, 2}
    peers = {c.peer for st in s.steps for c in st.comms}
    assert peers <= {3, 5, 1}  # its row (3, 5) and its column (1)
    assert part("all_reduce", "ring", [0, 1], 2, 4) is None


def test_compose_refuses_what_cannot_work():
    with pytest.raises(ValueError, match="buffers maps"):
        compose("all_reduce", "x", 0, 2, 4, 0, [
            part("all_reduce", "ring", [0, 1], 0, 4, buffers={"out": ("nowhere", 0)})])
    big = make_schedule("all_reduce", "ring", 0, 2, 4)
    big = dataclasses.replace(big, steps=(Step((Send(1, PHASE_TAGS, "out", 0, 1),)),))
    with pytest.raises(ValueError, match="below PHASE_TAGS"):
        compose("all_reduce", "x", 0, 2, 4, 0, [Part(big, (0, 1))])
    with pytest.raises(ValueError, match="not one of the ranks"):
        part("reduce", "binomial", [1, 2], 1, 4, root=0)


def test_build_fills_in_sizes():
    s = build("all_gather", "x", 1, 3, 2, 0, [Step((), (Copy("tmp", 4, "in", 0, 2),))])
    assert (s.in_size, s.out_size, s.tmp_size) == (2, 6, 6)
    assert isinstance(s, Schedule) and isinstance(s.steps, tuple)


def test_simulate_hierarchical_with_a_layout():
    nodes = (0, 0, 1, 1, 1)
    out = simulate("all_reduce", "hierarchical", [np.full(4, r) for r in range(5)],
                   nodes=nodes)
    assert all(np.array_equal(o, np.full(4, 10)) for o in out)

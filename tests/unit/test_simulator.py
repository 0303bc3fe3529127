"""The simulator itself: it must catch broken schedules, not just run good ones."""

from __future__ import annotations

import numpy as np
import pytest

from minidist.algorithms import Copy, Recv, Reduce, Schedule, Send, Step, make_schedule
from minidist.algorithms.analysis import ScheduleError, validate
from minidist.algorithms.simulator import (
    SimulationError,
    check_out_contract,
    first_out_writes,
    run,
    simulate,
)
from minidist.ops import ReduceOp


def sched(rank: int, size: int, steps: list[Step], *, count: int = 4, tmp: int = 4,
          in_size: int = 0, out_size: int = 4, collective: str = "test") -> Schedule:
    return Schedule(collective, "handmade", rank, size, count, 0, tmp, tuple(steps),
                    in_size, out_size)


def bufs(size: int, n: int = 4) -> list[dict[str, np.ndarray]]:
    return [{"in": np.zeros(0), "out": np.arange(n, dtype=float) + 10 * r,
             "tmp": np.zeros(n)} for r in range(size)]


def test_handmade_exchange_runs() -> None:
    steps = [
        [Step((Send(1, 0, "out", 0, 4), Recv(1, 0, "tmp", 0, 4)),
              (Reduce("out", 0, "out", 0, "tmp", 0, 4),))],
        [Step((Send(0, 0, "out", 0, 4), Recv(0, 0, "tmp", 0, 4)),
              (Reduce("out", 0, "tmp", 0, "out", 0, 4),))],
    ]
    b = bufs(2)
    run([sched(r, 2, s) for r, s in enumerate(steps)], b, ReduceOp.SUM, rendezvous=True)
    assert b[0]["out"].tolist() == b[1]["out"].tolist() == [10, 12, 14, 16]


def test_deadlock_is_reported_with_ranks_and_tags() -> None:
    # Both ranks wait to receive before sending anything.
    steps = [[Step((Recv(1 - r, 0, "tmp", 0, 4),)), Step((Send(1 - r, 0, "out", 0, 4),))]
             for r in range(2)]
    with pytest.raises(SimulationError, match="deadlock") as e:
        run([sched(r, 2, s) for r, s in enumerate(steps)], bufs(2), ReduceOp.SUM)
    assert "rank 0" in str(e.value) and "rank 1" in str(e.value) and "tag 0" in str(e.value)


def test_send_first_then_receive_deadlocks_only_under_rendezvous() -> None:
    steps = [[Step((Send(1 - r, 0, "out", 0, 4),)), Step((Recv(1 - r, 0, "tmp", 0, 4),))]
             for r in range(2)]
    schedules = [sched(r, 2, s) for r, s in enumerate(steps)]
    run(schedules, bufs(2), ReduceOp.SUM)  # fine with buffering
    with pytest.raises(SimulationError, match="deadlock"):
        run(schedules, bufs(2), ReduceOp.SUM, rendezvous=True)


def test_length_mismatch() -> None:
    steps = [[Step((Send(1, 0, "out", 0, 3),))], [Step((Recv(0, 0, "tmp", 0, 4),))]]
    with pytest.raises(SimulationError, match="length mismatch.*3.*4"):
        run([sched(r, 2, s) for r, s in enumerate(steps)], bufs(2), ReduceOp.SUM)


def test_message_never_received() -> None:
    steps = [[Step((Send(1, 0, "out", 0, 4),))], []]
    with pytest.raises(SimulationError, match="never received"):
        run([sched(r, 2, s) for r, s in enumerate(steps)], bufs(2), ReduceOp.SUM)


def test_tag_mismatch_is_a_deadlock_and_leftover() -> None:
    steps = [[Step((Send(1, 0, "out", 0, 4),))], [Step((Recv(0, 1, "tmp", 0, 4),))]]
    with pytest.raises(SimulationError, match="deadlock"):
        run([sched(r, 2, s) for r, s in enumerate(steps)], bufs(2), ReduceOp.SUM)


@pytest.mark.parametrize(("step", "match"), [
    (Step((Send(1, 0, "out", 0, 4), Recv(1, 0, "out", 2, 4))), "overlaps"),
    (Step((Recv(1, 0, "tmp", 0, 3), Recv(2, 0, "tmp", 2, 4))), "overlaps"),
    (Step((Send(1, 0, "out", 0, 2), Send(1, 1, "out", 2, 4))), "two Sends"),
    (Step((Recv(1, 0, "tmp", 0, 2), Recv(1, 1, "tmp", 2, 4))), "two Recvs"),
    (Step((Send(1, 0, "out", 0, 5),)), "out of range"),
    (Step((Send(1, 0, "out", 3, 2),)), "out of range"),
    (Step((Send(0, 0, "out", 0, 4),)), "bad peer"),
    (Step((Send(3, 0, "out", 0, 4),)), "bad peer"),
    (Step((Send(1, 0, "bogus", 0, 4),)), "unknown buffer"),  # type: ignore[arg-type]
    (Step((), (Copy("in", 0, "out", 0, 0),)), "writes the input"),
    (Step((), (Copy("out", 0, "out", 1, 2),)), "overlap"),
    (Step((), (Reduce("out", 0, "out", 1, "tmp", 0, 2),)), "partly overlaps"),
    (Step((), (Reduce("tmp", 2, "out", 0, "tmp", 0, 3),)), "out of range"),
])
def test_static_errors(step: Step, match: str) -> None:
    s = sched(0, 3, [step])
    with pytest.raises(ScheduleError, match=match):
        validate(s)
    with pytest.raises(SimulationError, match=match):
        run([s, sched(1, 3, []), sched(2, 3, [])], bufs(3), ReduceOp.SUM)


def test_sends_may_share_regions_and_reduce_may_alias_exactly() -> None:
    validate(sched(0, 3, [
        Step((Send(1, 0, "out", 0, 4), Send(2, 0, "out", 1, 3), Recv(1, 1, "tmp", 0, 4)),
             (Reduce("out", 0, "out", 0, "tmp", 0, 4), Copy("tmp", 0, "out", 0, 4))),
    ]))


def test_tag_reused_across_steps() -> None:
    s = sched(0, 2, [Step((Send(1, 0, "out", 0, 2),)), Step((Send(1, 0, "out", 2, 4),))])
    with pytest.raises(ScheduleError, match="tag 0 reused"):
        validate(s)


def test_group_consistency_and_buffers() -> None:
    good = [make_schedule("all_reduce", "ring", r, 3, 6) for r in range(3)]
    b = [{"out": np.ones(6), "tmp": np.zeros(4)} for _ in range(3)]
    with pytest.raises(SimulationError, match="expected rank 1"):
        run([good[0], good[0], good[2]], b, ReduceOp.SUM)
    other = make_schedule("all_reduce", "ring", 1, 3, 7)
    with pytest.raises(SimulationError, match="rank 1 runs"):
        run([good[0], other, good[2]], b, ReduceOp.SUM)
    with pytest.raises(SimulationError, match="'tmp' needs"):
        run(good, [{"out": np.ones(6)} for _ in range(3)], ReduceOp.SUM)
    run(good, b, ReduceOp.SUM)
    assert all(x["out"].tolist() == [3.0] * 6 for x in b)


def test_contract_checker_catches_an_early_write() -> None:
    """A naive all_reduce ring that accumulates straight into out breaks the contract."""
    def naive(rank: int, size: int) -> Schedule:
        steps = []
        right, left = (rank + 1) % size, (rank - 1) % size
        for s in range(size - 1):
            send_c, recv_c = (rank - s) % size, (rank - s - 1) % size
            steps.append(Step((Send(right, s, "out", send_c, send_c + 1),
                               Recv(left, s, "tmp", 0, 1)),
                              (Reduce("out", recv_c, "out", recv_c, "tmp", 0, 1),)))
        for s in range(size - 1):
            send_c, recv_c = (rank + 1 - s) % size, (rank - s) % size
            steps.append(Step((Send(right, size + s, "out", send_c, send_c + 1),
                               Recv(left, size + s, "out", recv_c, recv_c + 1))))
        return Schedule("all_reduce", "naive", rank, size, size, 0, 1, tuple(steps), 0, size)

    schedules = [naive(r, 4) for r in range(4)]
    b = [{"out": np.arange(4.0) + r, "tmp": np.zeros(1)} for r in range(4)]
    run(schedules, b, ReduceOp.SUM)
    assert all(x["out"].tolist() == [6.0, 10.0, 14.0, 18.0] for x in b)  # right answer...
    writes = first_out_writes(schedules)
    assert writes[0] is not None and writes[0].step == 0 and len(writes[0].known) == 2
    with pytest.raises(SimulationError, match="before hearing from ranks"):
        check_out_contract(schedules)  # ...but out was written too early


def test_contract_checker_rejects_non_reducing() -> None:
    with pytest.raises(ValueError, match="reducing"):
        check_out_contract([make_schedule("broadcast", "binomial", r, 2, 3) for r in range(2)])


def test_simulate_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="multiple"):
        simulate("reduce_scatter", "ring", [np.ones(5), np.ones(5)])
    with pytest.raises(ValueError, match="elements"):
        simulate("all_reduce", "ring", [np.ones(5), np.ones(4)])
    with pytest.raises(ValueError, match="dtype|float64|int64"):
        simulate("all_reduce", "ring", [np.ones(5), np.ones(5, np.int64)])
    with pytest.raises(TypeError, match="BXOR"):
        simulate("all_reduce", "ring", [np.ones(5), np.ones(5)], ReduceOp.BXOR)
    with pytest.raises(ValueError, match="root"):
        simulate("broadcast", "binomial", [np.ones(5), np.ones(5)], root=2)


def test_simulate_returns_flat_outputs_and_does_not_touch_inputs() -> None:
    x = [np.arange(6.0).reshape(2, 3) + r for r in range(3)]
    out = simulate("all_reduce", "tree", x, ReduceOp.AVG)
    assert all(o.shape == (6,) and o.tolist() == [1, 2, 3, 4, 5, 6] for o in out)
    assert x[0].tolist() == [[0, 1, 2], [3, 4, 5]]
    gathered = simulate("gather", "binomial", [np.array([r]) for r in range(3)], root=1)
    assert [g.tolist() for g in gathered] == [[], [0, 1, 2], []]
    assert simulate("barrier", "dissemination", [np.empty(0)] * 5)[0].size == 0

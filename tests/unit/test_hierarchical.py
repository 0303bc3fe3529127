"""The topology-aware all_reduce in the simulator, over many node layouts."""

import itertools

import numpy as np
import pytest

from minidist.algorithms import Send, make_schedule, simulator
from minidist.ops import ReduceOp

LAYOUTS = [(0,), (0, 0, 0), (0, 1), (0, 0, 1, 1), (0, 1, 0, 1, 2), (1, 0, 1, 0),
           (0, 0, 0, 1, 1, 2, 2, 2, 2), tuple(i // 4 for i in range(16)),
           tuple(i % 3 for i in range(11))]


def run(nodes, count, op=ReduceOp.SUM, dtype=np.int64):
    n = len(nodes)
    scheds = [make_schedule("all_reduce", "hierarchical", r, n, count, nodes=nodes,
                            itemsize=np.dtype(dtype).itemsize) for r in range(n)]
    rng = np.random.default_rng(count)
    inputs = [rng.integers(-9, 9, count).astype(dtype) for _ in range(n)]
    bufs = [{"out": x.copy(), "in": np.empty(0, dtype), "tmp": np.empty(s.tmp_size, dtype)}
            for x, s in zip(inputs, scheds)]
    simulator.run(scheds, bufs, op)
    return scheds, inputs, [b["out"] for b in bufs]


@pytest.mark.parametrize("nodes, count", list(itertools.product(LAYOUTS, [0, 1, 5, 40_000])))
def test_matches_numpy_and_keeps_the_contract(nodes, count):
    scheds, inputs, outs = run(nodes, count)
    want = np.sum(inputs, axis=0) if count else np.empty(0, np.int64)
    for o in outs:
        np.testing.assert_array_equal(o, want)
    simulator.check_out_contract(scheds)


def test_float_results_are_bit_identical():
    _, _, outs = run(LAYOUTS[6], 1000, dtype=np.float32)
    assert len({o.tobytes() for o in outs}) == 1


def cross_node_elements(algorithm, per_node, nnodes=4, count=1 << 16):
    nodes = tuple(i // per_node for i in range(nnodes * per_node))
    total = 0
    for r in range(len(nodes)):
        s = make_schedule("all_reduce", algorithm, r, len(nodes), count, nodes=nodes)
        total += sum(c.hi - c.lo for st in s.steps for c in st.comms
                     if isinstance(c, Send) and nodes[c.peer] != nodes[r])
    return total


def test_traffic_between_nodes_does_not_grow_with_processes_per_node():
    assert cross_node_elements("hierarchical", 2) == cross_node_elements("hierarchical", 8) > 0
    # a flat recursive doubling over the same ranks sends far more across nodes
    assert cross_node_elements("recursive_doubling", 8) > 4 * cross_node_elements(
        "hierarchical", 8)

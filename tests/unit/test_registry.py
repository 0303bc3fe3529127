"""The registry (make_schedule, choose), stats, and the purity of the algorithms layer."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

import minidist.algorithms as algos
from minidist.algorithms import (
    ALGORITHMS,
    ALLGATHER_RING_MIN_BYTES,
    ALLREDUCE_RING_MIN_BYTES,
    BROADCAST_SCATTER_ALLGATHER_MIN_BYTES,
    TREE_MIN_RANKS,
    choose,
    make_schedule,
    stats,
    validate,
)

COLLECTIVES = ("all_reduce", "broadcast", "barrier", "reduce", "all_gather", "reduce_scatter",
               "gather", "scatter", "all_to_all", "scan", "exscan")


def test_collective_names() -> None:
    assert set(ALGORITHMS) == set(COLLECTIVES)
    assert set(ALGORITHMS["all_reduce"]) >= {"ring", "recursive_doubling", "tree",
                                             "hierarchical", "shared_memory"}
    assert set(ALGORITHMS["broadcast"]) >= {"binomial", "scatter_allgather", "shared_memory"}
    # the order is the wire format: the first ones never move
    assert ALGORITHMS["all_reduce"][:5] == ("ring", "recursive_doubling", "tree",
                                            "hierarchical", "shared_memory")
    assert ALGORITHMS["barrier"] == ("dissemination", "tree")
    assert all(isinstance(v, tuple) and v for v in ALGORITHMS.values())


@pytest.mark.parametrize(("args", "match"), [
    (("allreduce", "ring", 0, 2, 4), "unknown collective"),
    (("all_reduce", "rings", 0, 2, 4), "unknown all_reduce algorithm.*ring"),
    (("all_reduce", "ring", 2, 2, 4), "rank 2 is outside"),
    (("all_reduce", "ring", -1, 2, 4), "rank -1 is outside"),
    (("all_reduce", "ring", 0, 0, 4), "size must be >= 1"),
    (("all_reduce", "ring", 0, 2, -1), "count must be >= 0"),
    (("broadcast", "binomial", 0, 2, 4, 5), "root 5 is outside"),
    (("barrier", "dissemination", 0, 2, 3), "count must be 0"),
    (("all_reduce", "ring", 0, 2, 4.0), "count must be an integer"),
    (("all_reduce", "ring", True, 2, 4), "rank must be an integer"),
])
def test_make_schedule_rejects_bad_arguments(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_schedule(*args)


def test_make_schedule_is_memoized_and_normalizes() -> None:
    a = make_schedule("all_reduce", "ring", 1, 4, 10)
    assert make_schedule("all_reduce", "ring", np.int64(1), 4, 10) is a
    # root is irrelevant for unrooted collectives and recorded as 0
    assert make_schedule("all_reduce", "ring", 1, 4, 10, root=3) is a
    assert a.root == 0
    assert make_schedule("broadcast", "binomial", 1, 4, 10, root=3).root == 3
    info = make_schedule.cache_info()  # type: ignore[attr-defined]
    assert info.maxsize and info.hits >= 2


def test_schedule_header_fields() -> None:
    s = make_schedule("all_gather", "ring", 2, 5, 3)
    assert (s.collective, s.algorithm, s.rank, s.size, s.count) == ("all_gather", "ring", 2, 5, 3)
    assert (s.in_size, s.out_size) == (3, 15)
    r = make_schedule("all_reduce", "recursive_doubling", 0, 4, 8)
    assert (r.in_size, r.out_size) == (0, 8)
    g = [make_schedule("gather", "linear", k, 3, 2, root=1) for k in range(3)]
    assert [x.out_size for x in g] == [0, 6, 0]
    sc = [make_schedule("scatter", "binomial", k, 3, 2, root=1) for k in range(3)]
    assert [x.in_size for x in sc] == [0, 6, 0]


def test_choose_defaults() -> None:
    small, big = ALLREDUCE_RING_MIN_BYTES - 1, ALLREDUCE_RING_MIN_BYTES
    assert choose("all_reduce", 8, small) == "recursive_doubling"
    assert choose("all_reduce", 8, big) == "ring"
    assert choose("all_reduce", 8, 10 * big, count=7) == "recursive_doubling"  # count < size
    # many ranks: trees send 2(n-1) messages instead of n log n
    assert choose("all_reduce", TREE_MIN_RANKS, small) == "tree"
    assert choose("all_reduce", TREE_MIN_RANKS - 1, small) == "recursive_doubling"
    assert choose("barrier", TREE_MIN_RANKS, 0) == "tree"
    assert choose("barrier", TREE_MIN_RANKS - 1, 0) == "dissemination"
    assert choose("broadcast", 8, BROADCAST_SCATTER_ALLGATHER_MIN_BYTES - 1) == "binomial"
    assert choose("broadcast", 8, BROADCAST_SCATTER_ALLGATHER_MIN_BYTES) == "scatter_allgather"
    assert choose("broadcast", 2, 1 << 30) == "binomial"
    assert choose("all_gather", 8, ALLGATHER_RING_MIN_BYTES) == "ring"
    assert choose("all_gather", 8, 8) == "recursive_doubling"
    assert choose("barrier", 8, 0) == "dissemination"
    for c in COLLECTIVES:
        for size in (1, 2, 3, 8, 100):
            for nbytes in (0, 4, 1 << 16, 1 << 20, 1 << 28):
                assert choose(c, size, nbytes) in ALGORITHMS[c]
    with pytest.raises(ValueError, match="unknown collective"):
        choose("allgather", 4, 4)
    with pytest.raises(ValueError):
        choose("all_reduce", 0, 4)


def test_every_schedule_validates_for_larger_groups() -> None:
    """Static checks (bounds, tags, per-step conflicts) for sizes the sweeps skip."""
    for c, names in ALGORITHMS.items():
        for a in names:
            for size in (31, 32, 33, 64):
                count = 0 if c == "barrier" else 3 * size - 1
                for rank in range(size):
                    validate(make_schedule(c, a, rank, size, count, root=size // 3))


def total(c: str, a: str, size: int, count: int, key: str, root: int = 0) -> list[int]:
    return [stats(make_schedule(c, a, r, size, count, root))[key] for r in range(size)]


def test_stats_match_the_cost_model() -> None:
    n, count = 8, 800
    ring = [stats(make_schedule("all_reduce", "ring", r, n, count), itemsize=4)
            for r in range(n)]
    assert all(s["rounds"] == 2 * (n - 1) and s["sends"] == 2 * (n - 1) for s in ring)
    assert all(s["bytes_sent"] == 2 * (n - 1) * count // n * 4 for s in ring)
    assert all(s["peers"] == 2 and s["reduced"] == (n - 1) * count // n for s in ring)
    rd = total("all_reduce", "recursive_doubling", n, count, "rounds")
    assert rd == [3] * n
    rd6 = total("all_reduce", "recursive_doubling", 6, count, "rounds")
    assert max(rd6) == 4  # fold in, 2 rounds, hand back
    for size in range(1, 18):
        assert total("barrier", "dissemination", size, 0, "rounds") == \
            [math.ceil(math.log2(size))] * size
        assert max(total("broadcast", "binomial", size, 5, "rounds")) <= \
            math.ceil(math.log2(size))
        bruck = total("all_gather", "recursive_doubling", size, 3, "rounds")
        assert bruck == [math.ceil(math.log2(size))] * size
        sent = total("all_gather", "recursive_doubling", size, 3, "elems_sent")
        assert sent == [3 * (size - 1)] * size
        assert total("all_to_all", "pairwise", size, 2, "sends") == [size - 1] * size
    # scatter+allgather broadcast: about 2N leaves the root instead of N * log2(n)
    sag = total("broadcast", "scatter_allgather", 16, 1600, "elems_sent")
    assert sag[0] < 2 * 1600 and max(sag) < 2 * 1600
    assert total("broadcast", "binomial", 16, 1600, "elems_sent")[0] == 4 * 1600


ALGO_DIR = Path(algos.__file__).parent
FORBIDDEN = {"socket", "asyncio", "threading", "selectors", "multiprocessing", "subprocess",
             "select", "ssl", "io", "os", "uvloop", "concurrent", "signal", "mmap"}


@pytest.mark.parametrize("path", sorted(ALGO_DIR.glob("*.py")), ids=lambda p: p.name)
def test_algorithms_layer_is_pure(path: Path) -> None:
    """No I/O or concurrency modules anywhere; numpy only in the simulator."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
            # the collective catalog (minidist.collectives, stdlib only) is shared by
            # every layer
            catalog = node.level == 2 and (node.module == "collectives" or (
                node.module is None and [a.name for a in node.names] == ["collectives"]))
            if node.level and path.name != "simulator.py" and not catalog:
                assert node.level == 1, f"{path.name} imports outside the package"
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top not in FORBIDDEN, f"{path.name} imports {name}"
            if path.name != "simulator.py":
                assert top != "numpy", f"{path.name} imports numpy"

"""An alpha-beta cost model that picks the all_reduce algorithm (pure: no I/O).

Two paths inside a node, each with a cost per message (alpha, seconds) and per byte
(beta, seconds):

* the socket path (``alpha_s``, ``beta_s``): one frame over a Unix socket, its
  payload reduced on arrival;
* the shared-memory path (``alpha_m``: one barrier round of empty frames, ``beta_m``:
  the copies and the reduction per byte of the vector, per rank).

A call takes as long as its critical path, or as long as the node's cores need for all
the ranks' work together, whichever is longer: ``T = max(C, W / cores)``. For an
all_reduce of ``N`` bytes over ``n`` ranks, with ``L = ceil(log2 n)`` and ``k`` chunks
of the shared-memory path:

==================  =================================  ==================================
algorithm           critical path C                    work of all ranks W
==================  =================================  ==================================
recursive_doubling  L (alpha_s + N beta_s)             n L (alpha_s + N beta_s)
tree                2 L (alpha_s + N beta_s)           2 (n-1) (alpha_s + N beta_s)
ring                2 (n-1) (alpha_s + N/n beta_s)     2 (n-1) (n alpha_s + N beta_s)
shared_memory       (k+1) L alpha_m + N beta_m         (k+1) n L alpha_m + n N beta_m
==================  =================================  ==================================

With a core per rank the first column decides (recursive doubling for small vectors,
the ring or shared memory for large ones); with many ranks per core the second does,
which favours trees, whose messages are fewest.

The parameters come from ``minidist calibrate`` (saved per machine) or the defaults
below, measured on a 2-core machine like the project's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Costs:
    """The model's parameters (seconds per message and per byte) and the node's cores."""

    alpha_s: float = 60e-6
    beta_s: float = 1.0e-9
    alpha_m: float = 60e-6
    beta_m: float = 0.35e-9
    cores: int = 2

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT = Costs()
CANDIDATES = ("recursive_doubling", "tree", "ring", "shared_memory")


def predict(algorithm: str, n: int, nbytes: int, c: Costs = DEFAULT,
            chunk_bytes: int = 2 << 20) -> float:
    """Predicted seconds of an all_reduce of ``nbytes`` over ``n`` ranks of one node
    (inf for an unknown algorithm, or a ring with fewer bytes than ranks)."""
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
    return max(critical, work / max(1, c.cores))


def choose(n: int, nbytes: int, c: Costs = DEFAULT, chunk_bytes: int = 2 << 20,
           candidates: tuple[str, ...] = CANDIDATES) -> str:
    """The candidate with the least predicted time (ties: the first listed)."""
    return min(candidates, key=lambda a: predict(a, n, nbytes, c, chunk_bytes))

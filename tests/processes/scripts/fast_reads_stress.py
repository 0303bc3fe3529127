"""All_reduces above DIRECT_MIN, where every rank reduces its share straight from the
others' vectors and then reads the other shares from them (peer_memory): sizes whose
shares do not divide evenly or span several pieces, several dtypes and ops, strided
arrays, a subgroup, AVG, with small and mid-size calls in between. Every result must
equal the reduction in rank order, bit for bit, on every rank; and the calls must have
taken that path (argv[1] "off": MINIDIST_SINGLE_COPY=0 on some rank, so none may)."""

import os
import sys

import numpy as np
from exact_reduce import check, data, expected

import minidist
from minidist.api import door
from minidist.shm import fast_slots

expect = sys.argv[1] if len(sys.argv) > 1 else "on"
if expect == "off" and os.environ.get("RANK") == "1":
    os.environ["MINIDIST_SINGLE_COPY"] = "0"
minidist.init(timeout=60)
rank, n = minidist.get_rank(), minidist.get_world_size()
sub = minidist.new_group(list(range(1, n)))
base = fast_slots.DIRECT_MIN
piece = fast_slots.DIRECT_CHUNK
SIZES = [base + 8, base + 4 * n * piece + 24, base + base // 4 + 40, base + 8 * (n - 1)]
OPS = [minidist.ReduceOp.SUM, minidist.ReduceOp.MAX, minidist.ReduceOp.PRODUCT,
       minidist.ReduceOp.AVG]


plan = door()._session.plan
paths = set()
for i in range(24):
    nbytes = SIZES[i % len(SIZES)]
    dt = np.dtype([np.float32, np.int64, np.float64, np.int32][i % 4])
    op = OPS[i % 4]
    if op == minidist.ReduceOp.AVG and dt.kind != "f":
        op = minidist.ReduceOp.SUM
    count = nbytes // dt.itemsize
    members = list(range(n)) if i % 3 else list(range(1, n))
    group = None if i % 3 else sub
    if rank not in members:
        continue
    want = expected(members, i, count, dt, op)
    mine = data(rank, i, count, dt)
    g = plan.world if group is None else group
    paths.add(plan.can_read(g))
    check(i, mine, want, op, group)
    small = np.array([rank], np.int32)
    minidist.all_reduce(small, group=group)
    assert small[0] == sum(members)
    mid = np.full(100_000, rank, np.float32)
    minidist.all_reduce(mid, group=group)
    assert (mid == sum(members)).all()
assert paths == ({True} if expect == "on" else {False}), paths
print("READS STRESS OK", flush=True)

"""Check all_reduce, broadcast and barrier against numpy on random inputs.

Run it with ``minidist run -n 8 examples/check_collectives.py [rounds]``. Every rank can
compute every other rank's input from a shared seed, so each checks its result against
a numpy reference. Prints one summary line on rank 0; exits non-zero on a mismatch.
"""

import os
import sys
import time

import numpy as np

import minidist
from minidist import ReduceOp

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]
OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG,
       ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
REF = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
       ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
       ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}


def valid(op, dtype):
    kind = np.dtype(dtype).kind
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return kind in "biu"
    if op == ReduceOp.AVG:
        return kind == "f"
    return True


def make_input(seed, rank, dtype, n):
    rng = np.random.default_rng([seed, rank])
    if np.dtype(dtype).kind == "b":
        return rng.integers(0, 2, n).astype(dtype)
    if np.dtype(dtype).kind == "f":
        return rng.integers(-8, 8, n).astype(dtype)  # small integers: sums are exact
    return rng.integers(0, 4, n).astype(dtype)


def main():
    minidist.init()
    rank, size = minidist.get_rank(), minidist.get_world_size()
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    plan = np.random.default_rng(2024)  # the same plan on every rank
    t0 = time.perf_counter()
    checked = 0
    for i in range(rounds):
        dtype = DTYPES[plan.integers(len(DTYPES))]
        n = int(plan.choice([0, 1, size - 1, size + 1, 1000, 100_003]))
        what = plan.choice(["all_reduce", "broadcast", "barrier"])
        if what == "all_reduce":
            op = OPS[plan.integers(len(OPS))]
            while not valid(op, dtype):
                op = OPS[plan.integers(len(OPS))]
            if op == ReduceOp.PRODUCT and np.dtype(dtype).kind == "f" and np.dtype(
                    dtype).itemsize == 2:
                op = ReduceOp.MAX  # float16 products overflow to inf: not a useful check
            x = make_input(i, rank, dtype, n)
            ref = make_input(i, 0, dtype, n)
            for r in range(1, size):
                ref = REF[op](ref, make_input(i, r, dtype, n))
            if op == ReduceOp.AVG:
                ref = ref / size
            minidist.all_reduce(x, op=op)
            if op == ReduceOp.AVG:
                np.testing.assert_allclose(x, ref.astype(dtype), rtol=1e-2)
            else:
                np.testing.assert_array_equal(x, ref.astype(dtype),
                                              err_msg=f"all_reduce {op.name} {dtype}")
        elif what == "broadcast":
            root = int(plan.integers(size))
            x = make_input(i, rank, dtype, n)
            minidist.broadcast(x, src=root)
            np.testing.assert_array_equal(x, make_input(i, root, dtype, n))
        else:
            minidist.barrier()
        checked += 1
    w = minidist.all_reduce(np.ones(3), op=ReduceOp.MAX, async_op=True)
    w.wait()
    if rank == 0:
        print(f"checked {checked} random collectives on {size} ranks in "
              f"{time.perf_counter() - t0:.2f} s: all match numpy", flush=True)
    gate = os.environ.get("MINIDIST_TEST_GATE")
    if gate:  # let a test inspect the running job's sockets before it ends
        print("READY", flush=True)
        end = time.time() + 60
        while not os.path.exists(gate) and time.time() < end:
            time.sleep(0.05)
    minidist.barrier()
    minidist.destroy()


if __name__ == "__main__":
    main()

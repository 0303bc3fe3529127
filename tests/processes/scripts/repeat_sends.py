"""Blocking sends like the last one to their rank (planned once, minidist.shm.p2p's
send_again), mixed with every other kind: rank 0 sends rounds of messages to ranks 1 and
2 on two tags, on the world and on a group of the same members (the same receiver and
tag, another group), of two dtypes and two shapes of one size, with a strided array and
an object now and then; the receivers take them in another order than they were sent
(per group and tag) and check every value. Then rank 1 receives on the loop (async, so its inbox
closes): the sends that follow find the inbox closed and go through the socket. Last,
rounds of three sends in one ``Door.send_each`` (two to rank 1), planned again when the
shape changes, one not C-contiguous now and then. Prints "REPEAT SENDS OK" on rank 0."""

import numpy as np

import minidist

minidist.init()
rank = minidist.get_rank()
pair = minidist.new_group([0, 1, 2])  # the world's members, another group
ROUNDS = 300
EACH = 100  # rounds of Door.send_each


def value(r: int, dst: int, tag: int, g: int, i: int) -> float:
    return float(((r * 7 + dst) * 5 + tag) * 3 + g) * 1000 + i


if rank == 0:
    for r in range(ROUNDS):
        for dst in (1, 2):
            for tag in (3, 4):
                for gi, g in enumerate((None, pair)):
                    shape = (4,) if tag == 3 else ((2, 3) if (r // 25) % 2 else (3, 2))
                    dtype = np.float64 if (r // 50) % 2 == 0 else np.float32
                    a = np.full(shape, value(r, dst, tag, gi, 0), dtype)
                    if r % 37 == 5 and tag == 4:
                        a = np.asfortranarray(a)  # not C-contiguous: the general path
                    minidist.send(a, dst, tag=tag, group=g)
            if r % 41 == 7:
                minidist.send_object(("round", r), dst, tag=9)
    minidist.send(np.zeros(1), 1, tag=5)  # rank 1 now receives on the loop
    for i in range(50):
        minidist.send(np.full(4, float(i)), 1, tag=3)
    door = minidist.api.door()  # several sends in one call (minidist.gymnasium's)
    for r in range(EACH):
        shape = (4,) if (r // 20) % 2 == 0 else (2, 2)  # a new shape: planned again
        arrays = [np.full(shape, float(r * 10 + j)) for j in range(3)]
        if r % 17 == 3:
            arrays[2] = np.full((2, 4), float(r * 10 + 2))[:, ::2]  # not contiguous
            assert not arrays[2].flags.c_contiguous  # (the general path)
        door.send_each(arrays, [1, 2, 1], 6, None)
    minidist.barrier()
    print("REPEAT SENDS OK", flush=True)
else:
    for r in range(ROUNDS):
        dtype = np.float64 if (r // 50) % 2 == 0 else np.float32
        for tag in (4, 3):  # the other order, and the group before the world
            for gi, g in ((1, pair), (0, None)):
                shape = (4,) if tag == 3 else ((2, 3) if (r // 25) % 2 else (3, 2))
                got = np.empty(shape, dtype)
                assert minidist.recv(got, 0, tag=tag, group=g) == 0
                want = value(r, rank, tag, gi, 0)
                assert (got == np.asarray(want, dtype)).all(), (r, tag, gi, got, want)
        if r % 41 == 7:
            assert minidist.recv_object(0, tag=9) == ("round", r)
    if rank == 1:
        minidist.recv(np.zeros(1), 0, tag=5)
        for i in range(50):
            got = np.empty(4)
            minidist.irecv(got, 0, tag=3).wait()
            assert (got == i).all(), (i, got)
    for r in range(EACH):
        shape = (4,) if (r // 20) % 2 == 0 else (2, 2)
        mine = (0, 2) if rank == 1 else (1,)
        for j in mine:
            got = np.empty((2, 2) if r % 17 == 3 and j == 2 else shape)
            minidist.recv(got, 0, tag=6)
            assert (got == r * 10 + j).all(), (r, j, got)
    minidist.barrier()
minidist.destroy()

"""The first node's ranks leave right after a barrier; the other nodes' ranks go on
working among themselves (one inside a collective meanwhile) and must finish cleanly."""

import time

import numpy as np

import minidist

minidist.init()
rank, per_node = minidist.get_rank(), minidist.get_local_world_size()
node = rank // per_node
mine = minidist.new_group([node * per_node + i for i in range(per_node)])
minidist.barrier()
if node > 0:
    # one rank waits inside a collective while the first node's ranks leave
    if minidist.get_local_rank() == 0:
        time.sleep(1.5)
    minidist.barrier(group=mine)
    for step in range(20):
        x = np.full(16, float(step))
        minidist.all_reduce(x, group=mine)
        assert x[0] == step * per_node
    print(f"rank {rank} rounds={step + 1}", flush=True)
minidist.destroy()

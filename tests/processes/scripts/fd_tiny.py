"""Init, one all_reduce and a barrier; rank 0 prints ``FD OK <world> <soft limit>``."""

import resource

import numpy as np

import minidist as md

md.init()
a = np.ones(1)
md.all_reduce(a)
assert a[0] == md.get_world_size(), a
md.barrier()
if md.get_rank() == 0:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    print(f"FD OK {md.get_world_size()} {soft}", flush=True)

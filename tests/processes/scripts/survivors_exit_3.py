"""Rank 1 kills itself with SIGKILL mid-job; the others exit with code 3 as soon as they
hear of it. The job's exit code must be the killed rank's (137), not a survivor's."""

import os
import signal
import sys

import numpy as np

import minidist

minidist.init(timeout=60)
x = np.ones(4)
minidist.all_reduce(x)
if minidist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    while True:
        minidist.all_reduce(x)
except minidist.PeerLostError:
    sys.exit(3)

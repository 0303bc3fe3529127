"""One rank exits with code 1 before it calls init(); the others are in (or about to
enter) init. Parameters: ``victim``, ``delay`` (seconds before it exits), ``gate``."""

from __future__ import annotations

import os
import sys
import time

from chaos_common import event, params, result, wait_gate

import minidist

p = params()
rank = int(os.environ["RANK"])
if rank == p["victim"]:
    time.sleep(p["delay"])
    event("EXITING", rank=rank)
    sys.exit(1)
event("INIT", rank=rank)
err = None
try:
    minidist.init()
except Exception as e:
    err = e
result(rank, err, phase="init")
wait_gate(p["gate"], 60)

"""Run the script named by argv[1] (with the rest of argv) on this rank with the core
argv says: even ranks compiled, odd ranks pure (``alternate``), or the same for all
(``compiled`` / ``pure``); prints the core each rank runs. Needs ``--start-method
spawn`` (the core is chosen when minidist is first imported)."""

import os
import runpy
import sys

choice = sys.argv[1]
rank = int(os.environ["RANK"])
pure = choice == "pure" or (choice == "alternate" and rank % 2 == 1)
os.environ["MINIDIST_CORE"] = "0" if pure else "1"

from minidist.shm import core  # noqa: E402

print(f"CORE rank{rank} {core.name()}", flush=True)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")

"""footprint_rank.py's workloads through minidist.torch, from a script that imports torch
at its top as torch scripts do (so ``minidist run`` imports it once before it forks):

    python -m minidist run -n N benchmarks/footprint_rank_torch.py WORKLOAD --torch
"""

import os
import sys

import torch  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from footprint_rank import main  # noqa: E402

if __name__ == "__main__":
    if "--torch" not in sys.argv[2:]:
        sys.argv.append("--torch")
    main()

"""The docs keep up with the code: every environment variable minidist reads is listed
in docs/environment.md."""

import re
from pathlib import Path

from minidist.algorithms import ALGORITHMS

ROOT = Path(__file__).resolve().parents[2]


def test_every_minidist_variable_is_documented():
    used = set()
    for path in (ROOT / "minidist").rglob("*.py"):
        used |= set(re.findall(r"MINIDIST_[A-Z_]*[A-Z]", path.read_text()))
    documented = (ROOT / "docs" / "environment.md").read_text()
    # the docs list MINIDIST_ALGO_<COLLECTIVE> once for every collective
    family = {f"MINIDIST_ALGO_{c.upper()}" for c in ALGORITHMS}
    missing = sorted(v for v in used - family if v not in documented)
    assert not missing, f"not in docs/environment.md: {missing}"

"""Gymnasium's own vector-env tests with minidist's class in place of
``gymnasium.vector.AsyncVectorEnv``: every test that passes with Gymnasium's class
passes with minidist's.

Gymnasium's tests are not part of its wheel: set ``MINIDIST_GYMNASIUM_TESTS`` to a
checkout of its repository at the installed version (the folder that holds ``tests/``);
without it this test is skipped. The suite runs twice in fresh interpreters, once as it
is and once with ``-p minidist_gym_swap`` (``suite/minidist_gym_swap.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

ROOT = Path(__file__).resolve().parents[2]
SUITE = ("tests/vector", "tests/envs/registration/test_make_vec.py", "tests/wrappers/vector")


def outcomes(checkout: Path, out: Path, swap: bool) -> dict[str, str]:
    """Each test's outcome (passed, failed, skipped) in one run of the suite."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent / "suite"), str(ROOT),
                                         env.get("PYTHONPATH", "")])
    # --tb=no: only the outcomes are read, and formatting some of the suite's failures
    # stops a run with pytest's INTERNALERROR (an AST recursion SystemError) before its end
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=no",
           "--timeout", "120",
           f"--junitxml={out}", *(["-p", "minidist_gym_swap"] if swap else []),
           *[s for s in SUITE if (checkout / s).exists()]]
    done = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=1800)
    # 0 or 1: the whole suite ran (some of its tests fail with Gymnasium's class too)
    assert done.returncode in (0, 1), (
        f"the suite did not run to its end (pytest exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}{done.stderr[-2000:]}")
    got = {}
    for case in ET.parse(out).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        got[name] = ("failed" if kinds & {"failure", "error"} else
                     "skipped" if "skipped" in kinds else "passed")
    return got


@pytest.mark.timeout(3700)
def test_gymnasiums_vector_tests_pass_with_minidists_class(tmp_path):
    where = os.environ.get("MINIDIST_GYMNASIUM_TESTS")
    if not where:
        pytest.skip("set MINIDIST_GYMNASIUM_TESTS to a checkout of Gymnasium's repository "
                    "at the installed version (its tests are not in the wheel)")
    checkout = Path(where)
    theirs = outcomes(checkout, tmp_path / "gymnasium.xml", swap=False)
    ours = outcomes(checkout, tmp_path / "minidist.xml", swap=True)
    passed = {t for t, o in theirs.items() if o == "passed"}
    assert len(passed) > 100, f"Gymnasium's suite barely ran: {len(passed)} passed"
    lost = sorted(t for t in passed if ours.get(t) != "passed")
    assert not lost, f"{len(lost)} tests pass with Gymnasium's class only: {lost[:20]}"

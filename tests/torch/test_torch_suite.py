"""PyTorch's own distributed test suite (``distributed_test.py``'s ``_DistTestBase``, as
upstream's ``test_distributed_spawn.py`` runs it) on minidist: minidist as a third-party
backend ("plugin") and minidist wherever the suite expects gloo ("swap"); see
tests/torch/torch_suite.py.

The default test run takes a representative subset (``DEFAULT``: 20 tests at world
size 2 under the "minidist" backend, in both modes: collectives, point-to-point with
any-source receives, groups and subgroups, destroy_group, barrier timeouts, DDP and
error paths; well under a minute on two cores). ``python -m pytest -m slow
tests/torch/test_torch_suite.py`` adds a wider selection (``QUICK``: world sizes 2, 4
and 8, ``-k representative``) and the whole suite at world sizes 2, 3 and 4 and its
tests of groups and barriers at 8, in both modes and on gloo, and checks that every
test that passes on gloo passes on minidist, except those listed with their reason in
``SKIPS``. ``MINIDIST_SUITE_START=spawn`` starts every test's ranks as fresh
interpreters, as upstream does (much slower).

torch's suite needs torch and expecttest (both in the ``test`` extra); without either,
these tests are skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch's distributed test suite needs torch "
                    "(pip install -e '.[test]')")
pytest.importorskip("expecttest", reason="torch's distributed test suite needs "
                    "expecttest (pip install -e '.[test]')")

from ..processes.harness import ROOT  # noqa: E402
from .jobs import kill_tree, torch_env  # noqa: E402
from .torch_suite import DEFAULT, MATCH_8, QUICK, SKIPS  # noqa: E402


def run_suite(mode: str, world_size: int, tmp_path, tests=(), timeout: float = 600,
              no_skips: bool = False, match=()) -> dict:
    """Run the suite (or ``tests`` of it) in a fresh interpreter; the outcome of every
    test (name -> {"outcome", "detail", "seconds"}). Killed with all its processes when
    it outlives ``timeout``."""
    out = tmp_path / f"{mode}{world_size}.json"
    log = tmp_path / f"{mode}{world_size}.log"
    start = os.environ.get("MINIDIST_SUITE_START", "fork")
    cmd = [sys.executable, "-m", "tests.torch.torch_suite", "--mode", mode,
           "--world-size", str(world_size), "--start", start, "--json", str(out)]
    for t in tests:
        cmd += ["-k", t]
    for m in match:
        cmd += ["--match", m]
    if no_skips:
        cmd.append("--no-skips")
    env = torch_env()
    for var in ("MINIDIST_TIMEOUT", "BACKEND", "TEMP_DIR", "INIT_METHOD",
                "MINIDIST_SUITE_MODE", "MINIDIST_SUITE_NO_SKIPS", "MINIDIST_SUITE_START"):
        env.pop(var, None)
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=ROOT)
        try:
            code = p.wait(timeout=timeout)
            why = f"ended with exit code {code} before its last test"
        except subprocess.TimeoutExpired:
            why = f"did not finish within {timeout:g} s"
        finally:
            kill_tree(p)
    report = json.loads(out.read_text()) if out.exists() else {}
    if not report.get("complete"):
        raise AssertionError(f"the suite ({mode}, {world_size} ranks) {why}; its log "
                             "ends with:\n" + log.read_text()[-4000:])
    return report["tests"]


def failures(outcomes: dict) -> str:
    bad = {n: o for n, o in outcomes.items() if o["outcome"] == "failed"}
    return "\n\n".join(f"{n}:\n{o['detail'][-2500:]}" for n, o in bad.items())


def skipped_for_minidist(outcomes: dict) -> set[str]:
    return {n for n, o in outcomes.items()
            if o["outcome"] == "skipped" and o["detail"].startswith("minidist: ")}


def all_passed(outcomes: dict, tests) -> None:
    assert not failures(outcomes), failures(outcomes)
    assert {n for n, o in outcomes.items() if o["outcome"] == "passed"} == set(tests), \
        {n: o for n, o in outcomes.items() if o["outcome"] != "passed"}


@pytest.mark.parametrize("mode", sorted(DEFAULT))
@pytest.mark.timeout(150)
def test_default_subset(mode, tmp_path):
    """The default run's share of torch's suite: ``DEFAULT[mode]`` at world size 2, every
    test passes (one runner process per mode, killed with its ranks on timeout)."""
    tests = DEFAULT[mode]
    all_passed(run_suite(mode, 2, tmp_path, tests, timeout=120), tests)


@pytest.mark.slow
@pytest.mark.parametrize("mode,world_size",
                         [pytest.param(m, w, id=f"{m}-{w}") for m, w in QUICK])
@pytest.mark.timeout(240)
def test_representative_selection(mode, world_size, tmp_path):
    tests = QUICK[(mode, world_size)]
    all_passed(run_suite(mode, world_size, tmp_path, tests, timeout=200), tests)


@pytest.mark.timeout(60)
def test_skip_list_names_tests_of_the_suite():
    """Every skipped test exists in torch's suite (a rename upstream shows up here)."""
    import importlib.util

    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    source = open(spec.origin).read()
    for name, (modes, reason) in SKIPS.items():
        assert f"def {name}(" in source, name
        assert modes and set(modes) <= {"plugin", "swap"} and reason, name
    for tests in (*QUICK.values(), *DEFAULT.values()):
        for name in tests:
            assert f"def {name}(" in source, name


# ---------------------------------------------------------------------- the whole suite

_gloo: dict[int, dict] = {}


def selection(world_size: int) -> tuple[str, ...]:
    """The whole suite up to world size 4; its tests of groups and barriers at 8."""
    return MATCH_8 if world_size == 8 else ()


def gloo_outcomes(world_size: int, tmp_path_factory) -> dict:
    if world_size not in _gloo:
        _gloo[world_size] = run_suite("gloo", world_size,
                                      tmp_path_factory.mktemp(f"gloo{world_size}"),
                                      timeout=3600, match=selection(world_size))
    return _gloo[world_size]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("mode", ["plugin", "swap"])
@pytest.mark.timeout(7500)
def test_whole_suite(mode, world_size, tmp_path, tmp_path_factory):
    """No test fails on minidist; in swap mode (gloo's selection and expectations)
    every test that passes on gloo passes on minidist too, unless SKIPS says why not.
    World size 8 runs the tests of groups and barriers (MATCH_8)."""
    outcomes = run_suite(mode, world_size, tmp_path, timeout=3600,
                         match=selection(world_size))
    assert not failures(outcomes), failures(outcomes)
    skipped = skipped_for_minidist(outcomes)
    assert skipped <= {n for n, (modes, _) in SKIPS.items() if mode in modes}
    if mode == "swap":
        gloo = gloo_outcomes(world_size, tmp_path_factory)
        passed = {n for n, o in outcomes.items() if o["outcome"] == "passed"}
        on_gloo = {n for n, o in gloo.items() if o["outcome"] == "passed"}
        assert on_gloo - skipped <= passed, sorted(on_gloo - skipped - passed)

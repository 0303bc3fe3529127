"""The alpha-beta cost model and the calibration file."""

import json
import math

import pytest

from minidist import calibrate
from minidist.algorithms import cost


def test_small_vectors_take_a_latency_algorithm_and_large_ones_a_bandwidth_one():
    for n in (2, 4, 8, 64):
        assert cost.choose(n, 4) in ("recursive_doubling", "tree")
        assert cost.choose(n, 64 << 20) in ("ring", "shared_memory")


def test_many_ranks_per_core_favour_trees():
    few_cores = cost.Costs(cores=2)
    many_cores = cost.Costs(cores=64)
    assert cost.choose(64, 4, few_cores) == "tree"
    assert cost.choose(64, 4, many_cores) == "recursive_doubling"


def test_without_shared_memory_large_vectors_avoid_recursive_doubling():
    cands = cost.CANDIDATES[:-1]
    # a core per rank: the ring's short critical path wins
    assert cost.choose(8, 64 << 20, cost.Costs(cores=8), candidates=cands) == "ring"
    # 8 ranks on 2 cores: ring and tree move the same bytes in all; never log2(n) copies
    assert cost.choose(8, 64 << 20, candidates=cands) != "recursive_doubling"


def test_predictions_grow_with_size_and_reject_impossible_rings():
    for alg in cost.CANDIDATES:
        assert cost.predict(alg, 8, 1 << 10) < cost.predict(alg, 8, 1 << 24)
    assert cost.predict("ring", 8, 4) == math.inf
    assert cost.predict("nonsense", 8, 4) == math.inf
    assert cost.predict("ring", 1, 1 << 20) == 0.0


def test_calibration_roundtrip(tmp_path, monkeypatch):
    where = tmp_path / "cal.json"
    monkeypatch.setenv("MINIDIST_CALIBRATION", str(where))
    assert calibrate.load() == cost.DEFAULT  # no file: the defaults
    c = cost.Costs(alpha_s=1e-5, beta_s=2e-10, alpha_m=3e-5, beta_m=1e-10, cores=4)
    calibrate.save(c)
    assert json.loads(where.read_text())["alpha_s"] == 1e-5
    assert calibrate.load() == c
    where.write_text("not json")
    assert calibrate.load() == cost.DEFAULT


@pytest.mark.timeout(60)
def test_measure_gives_positive_costs():
    c = calibrate.measure(quick=True)
    assert c.alpha_s > 0 and c.beta_s > 0 and c.alpha_m > 0 and c.beta_m > 0
    assert c.cores >= 1

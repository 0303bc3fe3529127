"""The chaos suite's seed: ``MINIDIST_CHAOS_SEED``, or a fresh one printed in the header
(run again with ``MINIDIST_CHAOS_SEED=<seed>`` to repeat every random choice)."""

from __future__ import annotations

import os
import secrets

import pytest

SEED = os.environ.get("MINIDIST_CHAOS_SEED") or secrets.token_hex(4)


def pytest_report_header(config) -> str:
    return f"minidist chaos seed: {SEED} (set MINIDIST_CHAOS_SEED={SEED} to repeat)"


@pytest.fixture
def chaos_seed() -> str:
    return SEED

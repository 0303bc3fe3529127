"""Which executor runs the shared-memory paths' per-call work: the compiled core
(``minidist.shm._core``, built from ``minidist/shm/_core.c`` by ``pip install``) or the pure-Python
one. Both follow one protocol (the layouts of :mod:`minidist.shm.fast_slots`,
:mod:`minidist.shm.area_layout` and :mod:`minidist.shm.rooted_area`), so ranks of one job may run
either.

``MINIDIST_CORE=0`` forces the pure core; ``MINIDIST_REQUIRE_CORE=1`` makes ``import
minidist`` fail when the compiled core cannot be loaded (CI: an optional build would hide
a broken one). ``python -m minidist info`` says which core is active and why.
"""

from __future__ import annotations

import logging
import os
import platform
from types import ModuleType

log = logging.getLogger("minidist.shm.core")

HOW_TO_BUILD = ("to build it, install a C compiler and Python's headers (for example "
                "`apt-get install gcc python3-dev`) and reinstall minidist (in a checkout: "
                "`pip install --force-reinstall --no-deps -e .`)")


# whether MINIDIST_CORE asks for the pure core (read once, as the core is chosen once)
PURE_ASKED = os.environ.get("MINIDIST_CORE", "1").strip() in ("0", "pure", "off", "false")


def _load() -> tuple[ModuleType | None, str]:
    """The compiled module and why it is (or is not) the active core."""
    if PURE_ASKED:
        return None, "MINIDIST_CORE=0 asks for the pure-Python core"
    if platform.machine() not in ("x86_64", "AMD64"):
        return None, (f"the compiled core runs on x86-64 only (this is "
                      f"{platform.machine()}); the shared-memory paths are off here")
    try:
        from . import _core
    except ImportError as e:
        return None, f"the compiled core was not built or does not load ({e}); {HOW_TO_BUILD}"
    return _core, f"minidist.shm._core loaded from {_core.__file__}"


compiled, why = _load()

if compiled is None and os.environ.get("MINIDIST_REQUIRE_CORE", "").strip() == "1" and \
        not PURE_ASKED:
    raise ImportError(f"MINIDIST_REQUIRE_CORE=1 but {why}")


def name() -> str:
    """``"compiled"`` or ``"pure"``: the core this process runs."""
    return "pure" if compiled is None else "compiled"


def info() -> dict[str, str]:
    """The active core and why (what ``python -m minidist info`` prints)."""
    return {"core": name(), "why": why}


_said = False


def announce(rank: int) -> None:
    """Once per job, at ``init()`` on rank 0: a warning when the pure core runs because
    the compiled one is missing (not when ``MINIDIST_CORE=0`` asked for it)."""
    global _said
    if _said or compiled is not None or rank != 0 or PURE_ASKED:
        return
    _said = True
    log.warning("minidist runs its pure-Python core: %s. The shared-memory paths work, "
                "slower; `python -m minidist info` says which core is active.", why)

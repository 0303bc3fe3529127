"""Gymnasium vector environments stepped through minidist.

``minidist.gymnasium.AsyncVectorEnv`` takes the place of
``gymnasium.vector.AsyncVectorEnv``: the same constructor, methods and results, with
the envs' processes stepped through shared memory instead of a pipe each. It needs
gymnasium (``pip install minidist[gymnasium]``).
"""

try:
    import gymnasium  # noqa: F401
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError("minidist.gymnasium needs gymnasium: pip install 'minidist[gymnasium]'"
                      ) from e

from ._parent import WorkerLostError
from ._serve import serve
from ._vector import AsyncVectorEnv

__all__ = ["AsyncVectorEnv", "WorkerLostError", "serve"]

"""Small environments for minidist.gymnasium's tests (importable by spawned workers)."""

from __future__ import annotations

import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Counter(gym.Env):
    """Observation ``[ident, count, pid]`` (float64); an action adds itself to ``count``;
    the episode ends when ``count`` reaches ``limit``. ``delay``: seconds each step
    sleeps (an int/float, or a callable of the step's count)."""

    metadata = {"render_modes": []}

    def __init__(self, ident: int = 0, limit: int = 5, delay: Any = 0.0,
                 info_bytes: int = 0) -> None:
        self.ident, self.limit, self.delay, self.info_bytes = ident, limit, delay, info_bytes
        self.observation_space = spaces.Box(-1e9, 1e9, (3,), np.float64)
        self.action_space = spaces.Discrete(3)
        self.count = 0
        self.steps = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.ident, self.count, os.getpid()], np.float64)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.count = 0
        info = {"seed": -1 if seed is None else seed}
        return self._obs(), info

    def step(self, action):
        self.steps += 1
        d = self.delay(self.steps) if callable(self.delay) else self.delay
        if d:
            time.sleep(d)
        self.count += int(action)
        info: dict[str, Any] = {}
        if self.info_bytes:
            info["blob"] = np.full(self.info_bytes, self.count % 251, np.uint8)
        return self._obs(), float(action) * 0.5, self.count >= self.limit, False, info


class Rich(gym.Env):
    """A Dict observation of every flat kind and a Tuple action: observations follow
    the actions, so that a mixed-up leaf shows."""

    def __init__(self, ident: int = 0) -> None:
        self.ident = ident
        self.observation_space = spaces.Dict({
            "box": spaces.Box(-10, 10, (2, 3), np.float32),
            "disc": spaces.Discrete(7, start=-2),
            "pair": spaces.Tuple((spaces.MultiBinary(5), spaces.MultiDiscrete([3, 4]))),
            "scalar": spaces.Box(0, 255, (), np.uint8),
        })
        self.action_space = spaces.Tuple((spaces.Discrete(4),
                                          spaces.Box(-1, 1, (2,), np.float32)))
        self.t = 0

    def _obs(self, a: int = 0, v: Any = (0.0, 0.0)) -> dict:
        box = np.full((2, 3), self.ident + self.t, np.float32)
        box[0, :2] = v
        bits = np.zeros(5, np.int8)
        bits[(self.t + a) % 5] = 1
        return {"box": box, "disc": np.int64(a - 2 + self.ident % 3),
                "pair": (bits, np.array([a % 3, self.t % 4], np.int64)),
                "scalar": np.uint8((self.ident * 10 + self.t) % 256)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        a, v = action
        self.t += 1
        return self._obs(int(a), v), float(a), self.t % 4 == 0, False, {"t": self.t}


class Words(gym.Env):
    """Custom (unbatchable) spaces: text observations and actions."""

    class Space(gym.Space):
        def sample(self, mask: Any = None, probability: Any = None) -> str:
            return "w"

        def contains(self, x: Any) -> bool:
            return isinstance(x, str)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Words.Space)

    def __init__(self) -> None:
        self.observation_space = Words.Space()
        self.action_space = Words.Space()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return f"said {action}", 1.0, False, False, {}


class Broken(Counter):
    """A Counter whose step raises ValueError for action 2."""

    def step(self, action):
        if int(action) == 2:
            raise ValueError(f"env {self.ident} refuses action 2")
        return super().step(action)


class Quitter(Counter):
    """A Counter whose process exits (status 0) when stepped with action 2."""

    def step(self, action):
        if int(action) == 2:
            os._exit(0)
        return super().step(action)

"""A pytest plugin that puts minidist.gymnasium.AsyncVectorEnv wherever gymnasium's own
tests take gymnasium.vector.AsyncVectorEnv (``-p minidist_gym_swap``, with this folder
on PYTHONPATH): see tests/gymnasium/test_gymnasium_suite.py."""

import gymnasium.vector
import gymnasium.vector.async_vector_env

from minidist.gymnasium import AsyncVectorEnv

gymnasium.vector.AsyncVectorEnv = AsyncVectorEnv
gymnasium.vector.async_vector_env.AsyncVectorEnv = AsyncVectorEnv

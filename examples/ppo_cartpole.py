"""PPO on CartPole-v1 over a vector of environments in subprocesses, until it is solved.

A self-contained PPO (torch only, CleanRL-style: GAE, the clipped surrogate objective, a
clipped value loss, an entropy bonus, minibatch Adam with a learning rate annealed
linearly to a tenth over ``--anneal-steps``) steps ``--num-envs`` CartPole-v1
environments, each in its own process, through either vector class:

* ``--vector minidist`` (the default): ``minidist.gymnasium.AsyncVectorEnv(env_fns)``;
* ``--vector gymnasium``: ``gymnasium.vector.AsyncVectorEnv(env_fns, shared_memory=True)``;
* ``--vector sync``: ``gymnasium.vector.SyncVectorEnv(env_fns)`` (all in this process,
  a baseline).

Run it with::

    python examples/ppo_cartpole.py                      # minidist.gymnasium.AsyncVectorEnv
    python examples/ppo_cartpole.py --vector gymnasium   # gymnasium.vector.AsyncVectorEnv

Options: ``--num-envs N`` (8), ``--seed S`` (1), ``--max-steps T`` (1,000,000 env steps),
``--target R`` (475). Training stops as soon as the mean return of the last ``--window``
(20) finished episodes reaches the target. It uses only the standard gymnasium vector
API with its default autoreset mode (``NEXT_STEP``): the step after an episode ends only
resets that environment, so that transition is left out of the rollout (its reward, its
action and its advantage), and the observation returned by the ending step, the episode's
last one, bootstraps the value of a truncated episode. Episode returns are summed here, so any
vector class will do. The defaults (8 environments, 64 steps each per rollout, 10 epochs
of 4 minibatches, lr 2e-3) reach 475 in about 40,000 env steps (20,000 - 70,000 over 20
seeds), a few tens of seconds on 2 cores.

It prints a progress line every few updates and, at the end, exactly one line starting
with ``RESULT``: the vector class, the number of environments, the env steps taken, the
wall seconds of the whole run (environment start-up included), env steps per second, the
final mean return and whether the target was reached. The exit code is 0 if it was, 1
if ``--max-steps`` ran out first.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

ENV_ID = "CartPole-v1"


def make_env() -> gym.Env:
    """One CartPole-v1 environment (a module-level function, so it pickles anywhere)."""
    return gym.make(ENV_ID)


def build_envs(vector: str, num_envs: int) -> gym.vector.VectorEnv:
    """``num_envs`` environments behind the chosen vector class."""
    env_fns: list[Callable[[], gym.Env]] = [make_env] * num_envs
    if vector == "minidist":
        from minidist.gymnasium import AsyncVectorEnv  # only when chosen

        return AsyncVectorEnv(env_fns)
    if vector == "gymnasium":
        return gym.vector.AsyncVectorEnv(env_fns, shared_memory=True)
    return gym.vector.SyncVectorEnv(env_fns)


def layer(n_in: int, n_out: int, std: float = float(np.sqrt(2))) -> nn.Linear:
    """A linear layer with orthogonal weights and zero bias."""
    lin = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(lin.weight, std)
    nn.init.constant_(lin.bias, 0.0)
    return lin


class Agent(nn.Module):
    """Separate actor and critic MLPs (two tanh layers of ``hidden`` units each)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(),
            layer(hidden, 1, 1.0),
        )
        self.actor = nn.Sequential(
            layer(obs_dim, hidden), nn.Tanh(), layer(hidden, hidden), nn.Tanh(),
            layer(hidden, n_actions, 0.01),
        )

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action per row of ``obs``, its log-probability and the state value."""
        logp_all = torch.log_softmax(self.actor(obs), dim=-1)
        action = torch.multinomial(logp_all.exp(), 1)
        logp = logp_all.gather(-1, action).squeeze(-1)
        return action.squeeze(-1), logp, self.value(obs)

    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probability of ``action``, the policy's entropy and the state value."""
        logp_all = torch.log_softmax(self.actor(obs), dim=-1)
        logp = logp_all.gather(-1, action[:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.value(obs)


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terms: np.ndarray,
    dones: np.ndarray,
    next_value: np.ndarray,
    gamma: float,
    lam: float,
) -> np.ndarray:
    """Generalized advantage estimates for a ``(steps, envs)`` rollout.

    Step ``t`` bootstraps from the value at ``t + 1`` unless the episode terminated there;
    after a truncation that value is the one of the episode's last observation (with
    ``NEXT_STEP`` autoreset, it is the observation of the masked reset step that follows).
    The recursion stops at every episode end.
    """
    steps = rewards.shape[0]
    adv = np.zeros_like(rewards)
    last = np.zeros_like(next_value)
    for t in reversed(range(steps)):
        nv = next_value if t == steps - 1 else values[t + 1]
        delta = rewards[t] + gamma * nv * (1.0 - terms[t]) - values[t]
        last = delta + gamma * lam * (1.0 - dones[t]) * last
        adv[t] = last
    return adv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vector", choices=["minidist", "gymnasium", "sync"], default="minidist")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=1_000_000, help="env steps at most")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--window", type=int, default=20, help="finished episodes in the mean")
    p.add_argument("--num-steps", type=int, default=64, help="steps per env per rollout")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--anneal-steps", type=int, default=150_000,
                   help="env steps over which the learning rate falls linearly to lr/10")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--print-every", type=int, default=10, help="updates between progress lines")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    start = time.perf_counter()
    envs = build_envs(args.vector, args.num_envs)
    n = args.num_envs
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    n_actions = int(envs.single_action_space.n)
    agent = Agent(obs_dim, n_actions)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr, eps=1e-5)

    T = args.num_steps
    obs_buf = np.zeros((T, n, obs_dim), np.float32)
    act_buf = np.zeros((T, n), np.int64)
    logp_buf = np.zeros((T, n), np.float32)
    val_buf = np.zeros((T, n), np.float32)
    rew_buf = np.zeros((T, n), np.float32)
    term_buf = np.zeros((T, n), np.float32)
    done_buf = np.zeros((T, n), np.float32)
    valid_buf = np.zeros((T, n), bool)

    obs, _ = envs.reset(seed=args.seed)
    obs = np.asarray(obs, np.float32).reshape(n, obs_dim)
    prev_done = np.zeros(n, bool)  # the env's last step ended an episode: this one resets
    ep_return = np.zeros(n, np.float64)
    recent: deque[float] = deque(maxlen=args.window)
    steps = 0
    update = 0
    reached = False
    step_time = 0.0  # seconds spent inside envs.step

    def mean_return() -> float:
        return float(np.mean(recent)) if recent else float("nan")

    try:
        while steps < args.max_steps and not reached:
            update += 1
            frac = min(1.0, steps / args.anneal_steps)
            for group in optimizer.param_groups:
                group["lr"] = args.lr * (1.0 - 0.9 * frac)

            filled = 0
            for t in range(T):
                obs_buf[t] = obs
                valid = ~prev_done
                valid_buf[t] = valid
                with torch.inference_mode():
                    action, logp, value = agent.act(torch.from_numpy(obs))
                actions = action.numpy()
                act_buf[t] = actions
                logp_buf[t] = logp.numpy()
                val_buf[t] = value.numpy()

                t0 = time.perf_counter()
                obs, reward, term, trunc, _ = envs.step(actions)
                step_time += time.perf_counter() - t0
                obs = np.asarray(obs, np.float32).reshape(n, obs_dim)
                steps += n
                filled = t + 1
                reward = np.where(valid, reward, 0.0)
                done = (np.asarray(term) | np.asarray(trunc)) & valid
                rew_buf[t] = reward
                term_buf[t] = np.asarray(term) & valid
                done_buf[t] = done
                ep_return += reward
                prev_done = done
                if done.any():
                    for i in np.flatnonzero(done):
                        recent.append(float(ep_return[i]))
                    ep_return[done] = 0.0
                    if len(recent) == recent.maxlen and mean_return() >= args.target:
                        reached = True
                        break
                if steps >= args.max_steps:
                    break
            if reached or filled < T:
                break

            # --- advantages over the valid (non-reset) steps, then the PPO update ---
            with torch.inference_mode():
                next_value = agent.value(torch.from_numpy(obs)).numpy()
            adv = gae(rew_buf, val_buf, term_buf, done_buf, next_value,
                      args.gamma, args.gae_lambda)
            ret = adv + val_buf
            keep = valid_buf.reshape(-1)
            b_obs = torch.from_numpy(obs_buf.reshape(-1, obs_dim)[keep])
            b_act = torch.from_numpy(act_buf.reshape(-1)[keep])
            b_logp = torch.from_numpy(logp_buf.reshape(-1)[keep])
            b_val = torch.from_numpy(val_buf.reshape(-1)[keep])
            b_adv = torch.from_numpy(adv.reshape(-1)[keep])
            b_ret = torch.from_numpy(ret.reshape(-1)[keep])
            batch = b_obs.shape[0]
            for _ in range(args.epochs):
                for mb in torch.randperm(batch).chunk(args.minibatches):
                    new_logp, entropy, new_val = agent.evaluate(b_obs[mb], b_act[mb])
                    ratio = (new_logp - b_logp[mb]).exp()
                    a = b_adv[mb]
                    a = (a - a.mean()) / (a.std() + 1e-8)
                    pg_loss = torch.max(
                        -a * ratio, -a * ratio.clamp(1.0 - args.clip, 1.0 + args.clip)
                    ).mean()
                    v_clipped = b_val[mb] + (new_val - b_val[mb]).clamp(-args.clip, args.clip)
                    v_loss = 0.5 * torch.max(
                        (new_val - b_ret[mb]) ** 2, (v_clipped - b_ret[mb]) ** 2
                    ).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + args.vf_coef * v_loss
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            if update % args.print_every == 0:
                elapsed = time.perf_counter() - start
                print(f"update {update:4d}  steps {steps:8d}  mean_return {mean_return():6.1f}  "
                      f"episodes {len(recent):2d}  {steps / elapsed:7.0f} steps/s  "
                      f"{elapsed:6.1f} s ({step_time:5.1f} s in envs.step)", flush=True)
    finally:
        envs.close()

    elapsed = time.perf_counter() - start
    print(f"RESULT vector={args.vector} num_envs={n} steps={steps} seconds={elapsed:.2f} "
          f"steps_per_s={steps / elapsed:.0f} mean_return={mean_return():.1f} "
          f"reached={reached}", flush=True)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())

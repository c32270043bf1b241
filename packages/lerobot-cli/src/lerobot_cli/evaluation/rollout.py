"""One batched rollout: a vector env reset with one seed per env, then policy and env stepped together
until every env is done, as LeRobot 0.6.1's ``rollout`` (``lerobot.scripts.lerobot_eval``) does it, so
the same policy, seeds and env give the same actions, rewards and successes.

Per step, as LeRobot: the observation mapped by :func:`~lerobot_cli.envs.observation.preprocess_observation`,
``task`` from the envs (``task_description``, else ``task``, else ``""``), the policy's pre-processor,
``select_action`` under ``torch.inference_mode``, the post-processor, the action to a CPU numpy
``(batch, action_dim)`` array, ``env.step``. ``done`` is latched per env; a done env is still stepped
(the vector env resets it in the same step) until all are done or ``max_episode_steps`` is reached, the
last step forcing every env done. Success is read from ``info["final_info"]["is_success"]`` when an env
finished in that step, else from ``info["is_success"]``.

Lockstep (data-parallel ranks under a sharded policy, where every forward all-gathers the weights):
``keep_stepping(all_done_here)`` is asked before each step whether to go on, and returns whether *any*
rank still has an env running (one all-reduce per step). Once every env here is done and it says go on,
the policy is still called on the last observation (its collectives match the other ranks'), the action
is thrown away and the env is not stepped; nothing more is recorded, so the recorded rollout is the
one-process one. A rank with no batch left rolls out a filler batch (``EpisodePlan.for_rank``) the same
way. Every rank starts each batch at the same step and ``select_action`` is called on every step, so a
chunking policy's queue refills (its forward passes) fall on the same steps on every rank. Without
``keep_stepping`` the loop stops when the envs here are done, as LeRobot's does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from attrs import define

from lerobot_cli.envs.observation import preprocess_observation

NEW_ROLLOUT_OPTION = "lerobot_new_rollout"  # LeRobot's reset option marking a rollout's start


class EvalPolicy(Protocol):
    def reset(self) -> None: ...

    def select_action(self, batch: dict[str, Any]) -> torch.Tensor: ...


Processor = Callable[[Any], Any]


class RolloutError(RuntimeError):
    """The policy's action does not fit the env (named in the message)."""


@define(frozen=True)
class BatchRollout:
    """A rollout's records, ``(n_envs, n_steps, ...)`` as LeRobot's: actions applied, rewards, successes
    and the latched done flags (once True, True to the end)."""

    actions: torch.Tensor
    rewards: torch.Tensor
    successes: torch.Tensor
    dones: torch.Tensor


def _task_names(env: Any) -> tuple[str, ...]:
    """Which of LeRobot's task attributes the envs have, asked once per rollout with
    ``has_wrapper_attr``: LeRobot just calls ``env.call(name)`` and catches the AttributeError, but in an
    ``AsyncVectorEnv`` that error shuts the worker down (gymnasium closes a worker that raised), so
    PushT, which has neither attribute, would lose its envs on the first step."""
    return tuple(name for name in ("task_description", "task") if all(env.call("has_wrapper_attr", name)))


def _tasks(env: Any, names: tuple[str, ...]) -> list[str]:
    """LeRobot's ``task``: ``task_description``, else ``task``, else ``""`` per env."""
    for name in names:
        try:
            return list(env.call(name))
        except (AttributeError, NotImplementedError):
            continue
    return [""] * env.num_envs


def _successes(info: dict[str, Any], n: int) -> list[bool]:
    """LeRobot's reading of success from a vector env's ``info`` (gymnasium >= 1.0: ``final_info`` is a
    dict of arrays; < 1.0: a per-env sequence)."""
    if "final_info" in info:
        final = info["final_info"]
        if isinstance(final, dict):
            flag = final.get("is_success", [False] * n)
            return flag.tolist() if hasattr(flag, "tolist") else [bool(flag)] * n
        return [
            bool(item["is_success"]) if isinstance(item, dict) and "is_success" in item else False
            for item in final
        ]
    if "is_success" in info:
        flag = info["is_success"]
        return flag.tolist() if hasattr(flag, "tolist") else [bool(flag)] * n
    return [False] * n


def _act(
    policy: EvalPolicy, pre: Processor, post: Processor, observation: Any, env: Any, tasks: tuple[str, ...]
) -> np.ndarray:
    batch = preprocess_observation(observation)
    batch["task"] = _tasks(env, tasks)
    batch = pre(batch)
    with torch.inference_mode():
        action = policy.select_action(batch)
    action = post(action).to("cpu").numpy()
    if action.ndim != 2:
        raise RolloutError(f"the policy's action must be (batch, action_dim) for the env, got {action.shape}")
    return action


def rollout_batch(
    env: Any,
    policy: EvalPolicy,
    preprocessor: Processor,
    postprocessor: Processor,
    seeds: Sequence[int | None],
    *,
    keep_stepping: Callable[[bool], bool] | None = None,
    render_callback: Callable[[Any], None] | None = None,
) -> BatchRollout:
    """Roll ``env`` (a gymnasium vector env of ``len(seeds)`` envs) out once with ``policy``; see the
    module docstring. ``render_callback(env)`` runs after the reset and after each env step (video)."""
    if len(seeds) != env.num_envs:
        raise ValueError(f"{len(seeds)} seeds for a vector env of {env.num_envs} envs")
    policy.reset()
    seed_arg = None if all(s is None for s in seeds) else list(seeds)
    observation, _ = env.reset(seed=seed_arg, options={NEW_ROLLOUT_OPTION: True})
    if render_callback is not None:
        render_callback(env)
    go_on = keep_stepping if keep_stepping is not None else (lambda all_done: not all_done)
    max_steps = env.call("_max_episode_steps")[0]
    tasks = _task_names(env)
    done = np.zeros(env.num_envs, dtype=bool)
    actions, rewards, successes, dones = [], [], [], []
    step = 0
    while step < max_steps and go_on(bool(done.all())):
        action = _act(policy, preprocessor, postprocessor, observation, env, tasks)
        step += 1
        if done.all():  # only keeping the other ranks' collectives company: nothing to step or record
            continue
        observation, reward, terminated, truncated, info = env.step(action)
        if render_callback is not None:
            render_callback(env)
        done = terminated | truncated | done
        if step == max_steps:
            done = np.ones_like(done, dtype=bool)
        actions.append(torch.from_numpy(action))
        rewards.append(torch.from_numpy(reward))
        dones.append(torch.from_numpy(done))
        successes.append(torch.tensor(_successes(info, env.num_envs)))
    return BatchRollout(
        actions=torch.stack(actions, dim=1),
        rewards=torch.stack(rewards, dim=1),
        successes=torch.stack(successes, dim=1),
        dones=torch.stack(dones, dim=1),
    )

"""Simulation evaluation during training (``--env.type``, ``--env_eval_freq``, ``--eval.*``) on every
data-parallel rank.

Every ``--env_eval_freq`` steps (after that step's checkpoint, as LeRobot orders them), each rank rolls
out its share of the episode plan (``evaluation.plan``: LeRobot's batches and env seeds, batch ``b`` on
rank ``b % N``) in its own vector env of ``--eval.batch_size`` envs, with the weights the run evaluates
with (the EMA's under ``--ema.use_for_eval``), the run's mixed precision and the policy in eval mode; the
RNG is forked, so training goes on exactly as without the eval. Under FSDP2/HSDP the ranks step in
lockstep (``evaluation.ranks``). The results are gathered by episode index, so 1 process and N ranks
report the same episodes; the main rank writes ``<output_dir>/eval/step_<step>/eval_info.json``
(LeRobot's schema plus each episode's seed and action digest) and logs LeRobot's ``eval/pc_success``,
``eval/avg_sum_reward``, ``eval/avg_max_reward``, ``eval/eval_s`` (metrics.jsonl and the trackers); the
videos of the first 4 episodes go beside it, each from the rank that rolled it out (``evaluation.videos``).

LeRobot 0.6.1 evaluates on the main process only while the others wait at a barrier, and refuses to under
FSDP; here the work is split, so no rank waits longer than its share and the collective timeout is
never approached by one rank working alone.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lerobot_ckpt.layout import step_dir_name
from lerobot_trainloop.evaluation import evaluating

from lerobot_cli.cli.errors import PROG
from lerobot_cli.errors import ConfigError
from lerobot_cli.evaluation.plan import EpisodePlan
from lerobot_cli.evaluation.ranks import (
    EvalInterrupted,
    Lockstep,
    PeerEvalFailed,
    PeerLost,
    first_line,
    gather_results,
    raised_in_a_collective,
)
from lerobot_cli.evaluation.results import EpisodeResult, eval_info, write_eval_info
from lerobot_cli.evaluation.run import evaluate_batches
from lerobot_cli.evaluation.videos import EpisodeVideos, video_paths
from lerobot_cli.fetching import decided_on_main

EVAL_DIR = "eval"
VIDEO_EPISODES = 4  # LeRobot's lerobot-train renders the first 4 episodes of each eval (lerobot-eval 10)


class EnvPolicyMismatch(ConfigError):
    """The policy's inputs or action are not what the env observes or takes."""


class SimEvalFailed(RuntimeError):
    """This rank's simulation eval raised (the env, most likely); its one line is already printed."""


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(value.shape[1:])


def check_policy_fits_env(policy_config, rename_map: dict[str, str], observation: dict, action_shape) -> None:
    """Every input the policy reads must be one the env observes, with the same shape (after
    ``--rename_map``), and its action the env's: a mismatch would fail at the first eval, hours in (or,
    worse, feed a camera of another size), so the run refuses at the start in one line."""
    seen = {rename_map.get(k, k): _shape(v) for k, v in observation.items() if hasattr(v, "shape")}
    skip = set(policy_config.placeholder_inputs())
    for key, feature in policy_config.input_features.items():
        if key in skip:
            continue
        if key not in seen:
            raise EnvPolicyMismatch(
                f"--env.type: the policy reads {key}, which the env does not observe (it gives "
                f"{', '.join(sorted(seen))}); evaluate in the env the dataset was recorded in, or map the "
                "names with --rename_map"
            )
        if tuple(feature.shape) != seen[key]:
            raise EnvPolicyMismatch(
                f"--env.type: the policy reads {key} of shape {tuple(feature.shape)}, the env gives "
                f"{seen[key]}"
            )
    action = policy_config.output_features.get("action")
    if action is not None and tuple(action.shape) != tuple(action_shape):
        raise EnvPolicyMismatch(
            f"--env.type: the policy's action has shape {tuple(action.shape)}, the env takes "
            f"{tuple(action_shape)}"
        )


def check_env_fits(env_cfg, seed: int | None, policy_config, rename_map: dict[str, str]) -> None:
    """Build one env of ``env_cfg``, reset it once (``seed``) and check the policy fits what it observes
    and takes (:func:`check_policy_fits_env`): every rank, before any work (they all agree, and a refusal
    leaves the run directory as it was)."""
    from lerobot_cli.envs.make import make_vector_env
    from lerobot_cli.envs.observation import preprocess_observation

    env = make_vector_env(env_cfg, 1, use_async_envs=False)
    try:
        observation, _ = env.reset(seed=seed)
        batch = preprocess_observation(observation)
        action_shape = env.single_action_space.shape
    finally:
        env.close()
    check_policy_fits_env(policy_config, rename_map, batch, action_shape)


def roll_out_share(
    rt,
    env_cfg,
    batch_size: int,
    use_async_envs: bool,
    policy: torch.nn.Module,
    preprocessor,
    postprocessor,
    batches: Sequence,
    *,
    seed: int | None,
    sharded: bool,
    failure: str,
    prog: str = PROG,
    around: Callable[[], AbstractContextManager] = nullcontext,
    autocast: Callable[[], AbstractContextManager] = nullcontext,
    videos: EpisodeVideos | None = None,
    signalled: Callable[[], int] = lambda: 0,
) -> list[EpisodeResult]:
    """Every rank (``lerobot-train`` and ``lerobot-eval``): roll out ``batches`` (this rank's share of the
    plan) in a vector env of ``batch_size`` envs, inside ``around()``, voting before every env step
    (:class:`~lerobot_cli.evaluation.ranks.Lockstep`), then gather every rank's results (sorted by episode
    index). ``videos``: where this rank renders the first episodes it rolls out (LeRobot's eval videos).

    When the rollout raises here, this rank votes failed (the peers raise
    :class:`~lerobot_cli.evaluation.ranks.PeerEvalFailed`), the lowest rank that failed prints
    ``<prog>: error: <failure> failed[ on rank N]: ...`` and it raises :class:`SimEvalFailed`; a peer lost
    (killed) is one line from the main rank; a signal (``signalled()``) makes every rank raise
    :class:`~lerobot_cli.evaluation.ranks.EvalInterrupted` at the same vote."""
    from lerobot_cli.envs.make import make_vector_env

    vote = Lockstep(rt.dp_group, rt.device, rt.dp_world_size, signalled, rank=rt.dp_rank)
    grad_mode = torch.no_grad if sharded else torch.inference_mode
    try:
        env = make_vector_env(env_cfg, batch_size, use_async_envs)
        try:
            with around():
                results = evaluate_batches(
                    env,
                    policy,
                    preprocessor,
                    postprocessor,
                    batches,
                    keep_stepping=vote,
                    seed=seed,
                    grad_mode=grad_mode,
                    autocast=autocast,
                    render=videos.render if videos is not None else None,
                    after_batch=videos.write if videos is not None else None,
                )
        finally:
            env.close()
        vote.finish()
    except (PeerEvalFailed, EvalInterrupted):
        raise
    except (PeerLost, dist.DistError) as exc:  # a peer killed mid-eval (in a vote or a sharded forward)
        _say_peer_lost(rt, prog, failure, exc)
        raise SimEvalFailed(str(exc)) from exc
    except Exception as exc:  # the env's (or the policy's) own error: the lowest failed rank says it
        lowest = vote.fail()
        if lowest is None and raised_in_a_collective(exc):  # gloo's "Connection reset" in an all-gather
            _say_peer_lost(rt, prog, failure, exc)
            raise SimEvalFailed(str(exc)) from exc
        if lowest is None or lowest == rt.dp_rank:
            where = f" on rank {rt.rank}" if rt.is_distributed else ""
            line = f"{prog}: error: {failure} failed{where}: {type(exc).__name__}: {exc}"
            print(line, file=sys.stderr, flush=True)
        raise SimEvalFailed(str(exc)) from exc
    return gather_results(results, rt.dp_group, rt.dp_world_size)


def _say_peer_lost(rt, prog: str, failure: str, exc: BaseException) -> None:
    """The main rank's one line for a peer gone mid-eval (the launcher's report names which)."""
    if rt.is_main:
        lost = f"another rank was lost ({first_line(exc)})"
        print(f"{prog}: error: {failure} stopped on rank {rt.rank}: {lost}", file=sys.stderr, flush=True)


def describe_sim_eval(cfg, batch_size: int, world: int) -> str:
    """The banner's (and the dry run's) line: episodes, batches, ranks, weights, seeds."""
    plan = EpisodePlan(n_episodes=cfg.eval.n_episodes, batch_size=batch_size, seed=cfg.seed)
    per_rank = -(-plan.n_batches // world)
    weights = "EMA" if cfg.ema.enable and cfg.ema.use_for_eval else "live"
    return (
        f"Sim eval: {plan.n_episodes} episodes of {cfg.env.type} ({cfg.env.task}) every "
        f"{cfg.env_eval_freq} steps, {plan.n_batches} batch{'es' if plan.n_batches != 1 else ''} of "
        f"{batch_size} envs over {world} rank{'s' if world != 1 else ''} ({per_rank} each), "
        f"{weights} weights, seeds from {cfg.seed}"
    )


class SimEval:
    """One run's simulation evals: what the run decided once (the batch size) and how to roll out."""

    def __init__(
        self,
        cfg,
        runtime,
        policy: torch.nn.Module,
        loop,
        preprocessor,
        postprocessor,
        signalled: Callable[[], int] = lambda: 0,
    ) -> None:
        self.cfg, self.runtime, self.policy, self.loop = cfg, runtime, policy, loop
        self.signalled = signalled
        self.pre, self.post = preprocessor, postprocessor
        self.ema = loop.ema if loop.ema is not None and cfg.ema.use_for_eval else None
        self.sharded = runtime.parallelism.is_sharded
        # LeRobot's automatic size depends on the machine's CPUs: one rank decides, all use it
        self.batch_size = decided_on_main(
            runtime, "the eval batch size", lambda: cfg.eval.resolved_batch_size()
        )
        self.plan = EpisodePlan(n_episodes=cfg.eval.n_episodes, batch_size=self.batch_size, seed=cfg.seed)

    def describe(self) -> str:
        return describe_sim_eval(self.cfg, self.batch_size, self.runtime.dp_world_size)

    def directory(self, step: int) -> Path:
        return Path(self.cfg.output_dir) / EVAL_DIR / f"step_{step_dir_name(step)}"

    def run(self, step: int, reporter) -> dict | None:
        """Every rank: roll out this rank's batches, gather; the main rank writes and logs. Returns the
        ``eval_info`` on the main rank (None elsewhere)."""
        rt = self.runtime
        videos_dir = self.directory(step) / "videos"
        start = time.perf_counter()
        episodes = roll_out_share(
            rt,
            self.cfg.env,
            self.batch_size,
            self.cfg.eval.use_async_envs,
            self.policy,
            self.pre,
            self.post,
            self.plan.for_rank(rt.dp_rank, rt.dp_world_size),
            seed=self.cfg.seed,
            sharded=self.sharded,
            failure=f"the simulation eval at step {step}",
            around=lambda: evaluating(self.loop.model, rt.device, self.ema),
            autocast=self.loop.precision.autocast,
            videos=EpisodeVideos(videos_dir, VIDEO_EPISODES),
            signalled=self.signalled,
        )
        eval_s = time.perf_counter() - start
        if not rt.is_main:
            return None
        videos = video_paths(videos_dir, len(episodes), VIDEO_EPISODES)
        info = eval_info(episodes, task_group=self.cfg.env.type, eval_s=eval_s, video_paths=videos)
        write_eval_info(self.directory(step), info)
        reporter.log_sim_eval(step, info["overall"], weights="EMA" if self.ema is not None else "live")
        if videos and Path(videos[0]).is_file():  # LeRobot logs the first episode's video to wandb
            reporter.video("eval/video", videos[0], step, self.cfg.env.fps)
        return info

    def run_or_stop(self, step: int, reporter) -> None:
        """:meth:`run`, except that a signal during the eval abandons it (said once, nothing written):
        the interrupt watch then stops the run and saves, as during training."""
        try:
            self.run(step, reporter)
        except EvalInterrupted as exc:
            reporter.print(
                f"sim eval step {step} abandoned: {signal.Signals(exc.signum).name} during the eval"
            )

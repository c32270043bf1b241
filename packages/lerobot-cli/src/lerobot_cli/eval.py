"""``lerobot-eval``: roll a saved policy out in a simulation env, as LeRobot 0.6.1's ``lerobot-eval``.

Flags are LeRobot's: ``--policy.path`` (a ``pretrained_model/`` or a checkpoint directory this stack or
LeRobot wrote, or a Hub id), ``--env.type`` and ``--env.<field>``, ``--eval.*``, ``--seed`` (1000),
``--output_dir`` (``outputs/eval/<date>/<time>_<job_name>``), ``--job_name`` (``<env>_<policy type>``),
``--rename_map``, ``--policy.device`` (cpu, cuda or auto) and ``--policy.use_amp`` (default: the saved
config's). Everything a user can get wrong (a flag, the policy directory, the env's extra) is refused in
one line with exit code 2 before a process group exists or a file is written.

One process, or any number under ``torchrun``: each rank loads the whole policy and rolls out its share
of LeRobot's batches (``EpisodePlan.for_rank``), with the env seeds ``--seed + episode`` and the torch RNG
seeded per batch, exactly as ``lerobot-train``'s simulation eval (``sim_eval``) does; the results are
gathered by episode, so N ranks report the episodes one process does, and a checkpoint evaluated here
reports what the training-time eval of the same weights reported. The main rank writes
``<output_dir>/eval_info.json`` (LeRobot's schema plus each episode's seed and actions digest; an existing
one is replaced atomically) and prints LeRobot's overall metrics. The first 10 episodes are rendered to
LeRobot's ``<output_dir>/videos/<env type>_0/eval_episode_<i>.mp4``, each by the rank that rolled it out
(``evaluation.videos``).

``--policy.<field>`` sets a field of the saved policy's config, as LeRobot's overrides do (e.g.
``--policy.n_action_steps``); one its weights do not fit is refused when they load. Not here:
``--eval.recording``.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from lerobot_ckpt import CheckpointError, CheckpointWriteError

from lerobot_cli.cli.errors import UsageError, exit_usage, leave_quietly
from lerobot_cli.cli.render import as_flags
from lerobot_cli.envs.config import env_class
from lerobot_cli.eval_config import (
    PROG,
    EvalRunConfig,
    build_eval_config,
    policy_class_for_help,
    render_help,
    with_policy_fields,
)


def warn(message: str) -> None:
    """One warning, from the main rank only (every rank reads the same flags and files)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"{PROG}: warning: {as_flags(message)}", file=sys.stderr)


def _check_inputs(cfg: EvalRunConfig, policy_fields: dict[str, str]):
    """Torch-free checks of everything a user can get wrong, before any process group or file: the env's
    extra, the policy directory and its files (``policy_fields`` applied to its config), the seeds, the
    output directory. Returns the finalized config, the policy directory and the policy's config when
    ``--policy.<field>`` flags changed it (else None: the saved one is loaded)."""
    import cattrs
    from lerobot_ckpt.layout import POLICY_CONFIG, POSTPROCESSOR_CONFIG, PREPROCESSOR_CONFIG

    from lerobot_cli import configio
    from lerobot_cli.cli.paths import resolve_policy_dir
    from lerobot_cli.envs.make import check_env_installed
    from lerobot_cli.evaluation.plan import EpisodePlan
    from lerobot_cli.evaluation.results import EVAL_INFO
    from lerobot_cli.policies.serialization import UnknownConfigKeysWarning, load_policy_config

    check_env_installed(cfg.env)
    directory = resolve_policy_dir(cfg.policy.path)
    file = directory / POLICY_CONFIG
    configio.read_json(file, "--policy.path config")  # missing / not JSON: one sentence naming the file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnknownConfigKeysWarning)
        try:
            saved = load_policy_config(file)
        except (ValueError, TypeError, cattrs.BaseValidationError) as exc:  # an unknown type, a bad field
            raise UsageError(f"--policy.path {file}: {exc}") from None
    for w in caught:  # LeRobot's newer fields: said once here, not again when the policy loads
        if issubclass(w.category, UnknownConfigKeysWarning):
            warn(f"--policy.path {file}: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    policy_cfg = with_policy_fields(saved, policy_fields, file) if policy_fields else None
    for name in (PREPROCESSOR_CONFIG, POSTPROCESSOR_CONFIG):
        if not (directory / name).is_file():
            raise UsageError(
                f"--policy.path={cfg.policy.path}: {directory} has no {name}: a policy is evaluated with the "
                "processors it was saved with"
            )
    # the seeds fit an env (the main rank may decide another automatic batch size; the check is re-run)
    EpisodePlan(n_episodes=cfg.eval.n_episodes, batch_size=cfg.eval.resolved_batch_size(), seed=cfg.seed)
    cfg = cfg.finalized(saved.type)
    out = Path(cfg.output_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output_dir={cfg.output_dir} is a file, not a directory")
    if (out / EVAL_INFO).is_symlink() or (out / EVAL_INFO).is_dir():
        raise UsageError(
            f"--output_dir={cfg.output_dir}: {out / EVAL_INFO} is a symlink or a directory, so it is not "
            "replaced; remove it or choose another --output_dir"
        )
    return cfg, directory, policy_cfg


def _set_rename_map(pre, rename_map: dict[str, str], directory: Path) -> None:
    """LeRobot's override of the saved pre-processor's ``rename_observations_processor``: this run's map
    (``{}`` clears a saved one)."""
    from lerobot_cli.processors.steps import RenameObservationsStep

    steps = [step for step in pre.steps if isinstance(step, RenameObservationsStep)]
    if rename_map and not steps:
        raise UsageError(
            f"--rename_map: {directory} has no rename_observations_processor step to rename the env's "
            "observations with"
        )
    for step in steps:
        step.rename_map = dict(rename_map)


def evaluate(cfg: EvalRunConfig, directory: Path, runtime, policy_config=None) -> dict | None:
    """Every rank: load the policy (with ``policy_config`` instead of its saved one, if given), check it
    fits the env, roll out this rank's batches, gather; the main rank writes ``eval_info.json`` and prints
    the metrics. Returns the ``eval_info`` on the main rank."""
    import contextlib
    import functools
    import time

    import torch

    from lerobot_cli.evaluation.plan import EpisodePlan
    from lerobot_cli.evaluation.results import eval_info, write_eval_info
    from lerobot_cli.evaluation.videos import EpisodeVideos, video_paths
    from lerobot_cli.fetching import decided_on_main
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.policies.serialization import UnknownConfigKeysWarning
    from lerobot_cli.processors.factory import load_processors
    from lerobot_cli.seeding import set_seed
    from lerobot_cli.sim_eval import check_env_fits, roll_out_share

    rt = runtime
    if cfg.seed is not None:
        set_seed(cfg.seed)  # LeRobot's, once before anything draws
    batch_size = decided_on_main(rt, "the eval batch size", cfg.eval.resolved_batch_size)
    plan = EpisodePlan(n_episodes=cfg.eval.n_episodes, batch_size=batch_size, seed=cfg.seed)
    with warnings.catch_warnings():  # its unknown keys were said before the process group
        warnings.simplefilter("ignore", UnknownConfigKeysWarning)
        policy_cfg, policy = load_pretrained(directory, config=policy_config, device=rt.device)
    pre, post = load_processors(directory, device=str(rt.device))
    _set_rename_map(pre, cfg.rename_map, directory)
    check_env_fits(cfg.env, cfg.seed, policy_cfg, cfg.rename_map)
    use_amp = policy_cfg.use_amp if cfg.policy.use_amp is None else cfg.policy.use_amp
    autocast = functools.partial(torch.autocast, rt.device.type) if use_amp else contextlib.nullcontext
    world = rt.dp_world_size
    if rt.is_main:
        seeds = "unseeded" if cfg.seed is None else f"seeds from {cfg.seed}"
        print(
            f"Eval: {policy_cfg.type} from {directory} on {cfg.env.type} ({cfg.env.task}), "
            f"{plan.n_episodes} episodes in {plan.n_batches} batch{'es' if plan.n_batches != 1 else ''} of "
            f"{batch_size} envs over {world} rank{'s' if world != 1 else ''}, {seeds}, device {rt.device}"
            f"{', amp' if use_amp else ''}",
            flush=True,
        )
    videos_dir = Path(cfg.output_dir) / "videos" / f"{cfg.env.type}_0"  # LeRobot's <task_group>_<task_id>
    start = time.perf_counter()
    episodes = roll_out_share(
        rt,
        cfg.env,
        batch_size,
        cfg.eval.use_async_envs,
        policy,
        pre,
        post,
        plan.for_rank(rt.dp_rank, world),
        seed=cfg.seed,
        sharded=False,
        failure="the simulation eval",
        prog=PROG,
        autocast=autocast,
        videos=EpisodeVideos(videos_dir),
    )
    eval_s = time.perf_counter() - start
    if not rt.is_main:
        return None
    info = eval_info(
        episodes, task_group=cfg.env.type, eval_s=eval_s, video_paths=video_paths(videos_dir, len(episodes))
    )
    path = write_eval_info(cfg.output_dir, info)
    overall = info["overall"]
    print(
        f"Overall Aggregated Metrics: pc_success={overall['pc_success']:.1f} "
        f"avg_sum_reward={overall['avg_sum_reward']:.4f} avg_max_reward={overall['avg_max_reward']:.4f} "
        f"eval_s={overall['eval_s']:.2f} ({overall['n_episodes']} episodes)",
        flush=True,
    )
    print(f"eval_info.json: {path}", flush=True)
    return info


def _run(cfg: EvalRunConfig, directory: Path, policy_config=None) -> int:
    from lerobot_parallel import ParallelismError
    from lerobot_parallel.job_message import print_once_per_job
    from lerobot_parallel.teardown import parallel_session

    from lerobot_cli.errors import ConfigError
    from lerobot_cli.evaluation.ranks import PeerEvalFailed
    from lerobot_cli.sim_eval import SimEvalFailed

    try:
        with parallel_session(device=cfg.policy.device) as runtime:
            try:
                evaluate(cfg, directory, runtime, policy_config)
            except SimEvalFailed:  # its line is out (from the rank it failed on)
                raise SystemExit(1) from None
            except PeerEvalFailed:  # the failed rank said why
                leave_quietly(1)
            except (ConfigError, CheckpointError) as exc:  # the policy's files, the env: every rank alike
                code = 1 if isinstance(exc, CheckpointWriteError) else 2  # eval_info.json not written: 1
                lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
                print_once_per_job(f"{PROG}: error: {as_flags(lines[0] if lines else exc)}", runtime)
                raise SystemExit(code) from None
    except ParallelismError as exc:  # --policy.device, or the launch, refused before the process group
        exit_usage(PROG, as_flags(str(exc)))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        from lerobot_cli.cli.argv import split_argv

        parsed = split_argv(argv)
        if parsed.help:
            env_cls = env_class(parsed.flags["env.type"]) if "env.type" in parsed.flags else None
            sys.stdout.write(render_help(env_cls, policy_class_for_help(parsed.flags)))
            return 0
        cfg, directory, policy_config = _check_inputs(*build_eval_config(parsed.flags))
    except (ValueError, CheckpointError) as exc:  # UsageError, the env's missing extra, an unsafe directory
        exit_usage(PROG, as_flags(str(exc)))
    return _run(cfg, directory, policy_config)


if __name__ == "__main__":
    raise SystemExit(main())

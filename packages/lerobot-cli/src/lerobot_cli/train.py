"""``lerobot-train``: parse and check everything torch-free, then hand the config to the runner."""

from __future__ import annotations

import os
import sys

from lerobot_cli.cli.errors import PROG, UsageError, exit_usage
from lerobot_cli.cli.render import as_flags


def _policy_class_for_help(flags: dict[str, str]):
    from lerobot_cli.cli.build import build_train_config
    from lerobot_cli.policies import registry

    if "policy.type" in flags:
        return registry.config_class(flags["policy.type"])
    if "policy.path" in flags or "config_path" in flags:
        keep = {k: v for k, v in flags.items() if k in ("policy.path", "config_path")}
        policy = build_train_config(keep).config.policy
        return type(policy) if policy is not None else None
    return None


def _env_class_for_help(flags: dict[str, str]):
    from lerobot_cli.envs.config import env_class

    if "env.type" not in flags:
        return None
    try:
        return env_class(flags["env.type"])
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _format_for_resume(cfg, flags: dict[str, str]):
    """A sharded run's ``dcp``/``safetensors_dcp`` format, inherited from its ``train_config.json``,
    cannot apply when the resumed run is not sharded: write ``safetensors`` instead (and say so)
    rather than refusing. An explicit ``--checkpoint_format`` is still checked as given."""
    if not cfg.resume or "checkpoint_format" in flags or cfg.checkpoint_format.value == "safetensors":
        return cfg
    from attrs import evolve
    from lerobot_parallel.launch_env import LaunchEnv

    try:
        sharded = cfg.parallelism.resolve(LaunchEnv.from_environ().world_size).is_sharded
    except ValueError:
        return cfg  # bad degrees: the runner reports them
    if sharded:
        return cfg
    warn(
        f"the resumed run is not sharded, so its checkpoints are written as safetensors (the saved "
        f"config's checkpoint_format={cfg.checkpoint_format.value} applies to sharded runs only)"
    )
    return evolve(cfg, checkpoint_format="safetensors")


def _is_main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


def warn(message: str) -> None:
    """One warning, from the main rank only (every rank parses the same flags and files)."""
    if _is_main_rank():
        print(f"{PROG}: warning: {as_flags(message)}", file=sys.stderr)


def _claim_run_dir(plan):
    """Main rank: lock the run directory, then check what may be done to it (nothing is moved yet).

    Other ranks take no lock: they write no run files. A refusal here ends this rank with exit 2
    before a process group exists, and the launcher ends the others, so it is printed once.
    """
    from lerobot_ckpt import RunDirectoryError, RunLock

    from lerobot_cli.rundir import inspect_run_dir

    try:
        lock = RunLock.acquire(plan.cfg.output_dir)
    except RunDirectoryError as exc:
        raise UsageError(f"--output_dir: {exc}") from None
    try:
        return lock, inspect_run_dir(plan, lock.stale)
    except BaseException:
        lock.release()
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        from lerobot_cli.cli.argv import split_argv
        from lerobot_cli.cli.build import build_train_config
        from lerobot_cli.cli.checks import check_checkpointing_off, check_runnable

        parsed = split_argv(argv)
        if parsed.help:
            from lerobot_cli.cli.help import render_help

            sys.stdout.write(
                render_help(_policy_class_for_help(parsed.flags), _env_class_for_help(parsed.flags))
            )
            return 0
        result = build_train_config(parsed.flags)
        for message in result.warnings:
            warn(message)
        cfg = result.config.finalized()
        cfg = _format_for_resume(cfg, parsed.flags)
        from lerobot_cli.runplan import publish_from_flags

        cfg, publish_note = publish_from_flags(cfg, parsed.flags)
        if publish_note:
            warn(publish_note)
        check_runnable(cfg, result.config_path)
        check_checkpointing_off(cfg, parsed.flags)
        from lerobot_parallel.env_guard import enforce_accelerate_env_guard

        enforce_accelerate_env_guard(cfg.accelerator.mixed_precision, warn=warn)
        from lerobot_cli.runplan import plan_run

        plan = plan_run(cfg, parsed.flags, result.config_path, is_main=_is_main_rank())
        cfg = plan.cfg
    except (UsageError, ValueError) as exc:
        exit_usage(PROG, as_flags(str(exc)))
    if cfg.dry_run:
        from lerobot_cli.datasets import DatasetError
        from lerobot_cli.dry_run import dry_run

        try:
            return dry_run(cfg)
        except (DatasetError, ValueError) as exc:
            exit_usage(PROG, as_flags(str(exc)))
    lock = work = None
    try:
        if _is_main_rank():
            try:
                from lerobot_cli.hubcheck import check_publish_target, wants_publish

                if wants_publish(cfg):
                    check_publish_target(cfg.policy.repo_id)
                lock, work = _claim_run_dir(plan)
            except UsageError as exc:
                exit_usage(PROG, as_flags(str(exc)))
        for note in plan.notes:
            warn(note)
        from lerobot_cli.runner import run

        return run(plan, work, release=lock.release if lock is not None else None)
    finally:
        if lock is not None:
            lock.release()


if __name__ == "__main__":
    raise SystemExit(main())

"""``lerobot-train``: parse and check everything torch-free, then hand the config to the runner."""

from __future__ import annotations

import os
import sys

from lerobot_cli.cli.errors import UsageError, exit_usage

PROG = "lerobot-train"


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
    if os.environ.get("RANK", "0") == "0":
        warn(f"the resumed run is not sharded, so its checkpoints are written as safetensors (the saved "
             f"config's checkpoint_format={cfg.checkpoint_format.value} applies to sharded runs only)")
    return evolve(cfg, checkpoint_format="safetensors")


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        from lerobot_cli.cli.argv import split_argv
        from lerobot_cli.cli.build import build_train_config
        from lerobot_cli.cli.checks import check_runnable

        parsed = split_argv(argv)
        if parsed.help:
            from lerobot_cli.cli.help import render_help

            sys.stdout.write(render_help(_policy_class_for_help(parsed.flags)))
            return 0
        result = build_train_config(parsed.flags)
        for message in result.warnings:
            warn(message)
        cfg = result.config.finalized()
        cfg = _format_for_resume(cfg, parsed.flags)
        check_runnable(cfg, result.config_path)
        from lerobot_parallel.env_guard import enforce_accelerate_env_guard

        main_rank = os.environ.get("RANK", "0") == "0"
        enforce_accelerate_env_guard(cfg.accelerator.mixed_precision, warn=warn if main_rank else lambda _m: None)
    except (UsageError, ValueError) as exc:
        exit_usage(PROG, str(exc))
    if cfg.dry_run:
        from lerobot_cli.datasets import DatasetError
        from lerobot_cli.dry_run import dry_run

        try:
            return dry_run(cfg)
        except (DatasetError, ValueError) as exc:
            exit_usage(PROG, str(exc))
    from lerobot_cli.runner import run

    return run(cfg, config_path=result.config_path)


if __name__ == "__main__":
    raise SystemExit(main())

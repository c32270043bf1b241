"""Run-level checks that need the whole config and the file system (still before torch)."""

from __future__ import annotations

from pathlib import Path

import attrs

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.config import TrainConfig
from lerobot_cli.extras import missing_extra_message
from lerobot_cli.policies.registry import spec_of


def check_runnable(cfg: TrainConfig, config_path: Path | None) -> None:
    if cfg.policy is None:
        raise UsageError(
            "no policy: pass --policy.type=NAME to train from scratch or --policy.path=DIR to fine-tune"
        )
    if cfg.dataset.repo_id is None and cfg.dataset.root is None:
        raise UsageError(
            "no dataset: pass --dataset.repo_id=OWNER/NAME (and --dataset.root=DIR for a local copy)"
        )
    if cfg.resume and config_path is None:
        raise UsageError(
            "--resume=true has nothing to resume: pass --config_path=<output_dir>/checkpoints/last/"
            "pretrained_model/train_config.json (or that checkpoint directory)"
        )
    if cfg.policy.repo_id and cfg.policy.push_to_hub:
        if not cfg.save_checkpoint:
            raise UsageError(
                "--policy.repo_id publishes the final checkpoint, so it needs --save_checkpoint=true "
                "(or pass --policy.push_to_hub=false)"
            )
        if cfg.checkpoint_format.value == "dcp":
            raise UsageError(
                "--policy.repo_id with --checkpoint_format=dcp: the final checkpoint would hold no "
                "model.safetensors to publish; use --checkpoint_format=safetensors_dcp, or convert "
                "and publish later with lerobot-convert-dcp --push_to_hub"
            )
    if cfg.rename_map and not cfg.policy.pretrained_path:
        from lerobot_cli.rename import NEEDS_PRETRAINED

        raise UsageError(NEEDS_PRETRAINED)
    if cfg.eval_steps > 0 and cfg.dataset.eval_split == 0:
        raise UsageError(
            f"--eval_steps={cfg.eval_steps} has no held-out data to evaluate on: pass "
            "--dataset.eval_split=FRACTION (e.g. 0.1), or --eval_steps=0"
        )
    if cfg.eval_steps == 0 and cfg.dataset.eval_split > 0:  # it trained on fewer episodes, silently
        raise UsageError(
            f"--dataset.eval_split={cfg.dataset.eval_split} holds episodes out of training, but "
            "--eval_steps=0 never evaluates on them: pass --eval_steps=N (the eval loss every N steps), "
            "or --dataset.eval_split=0 to train on every episode"
        )
    check_extras(cfg)
    check_sim_eval(cfg)
    check_custom_code(cfg)
    check_external_sources(cfg)
    check_policy_fits_local_dataset(cfg)
    if cfg.peft is not None:
        check_peft(cfg)
    if cfg.sample_weighting is not None:
        check_sample_weighting(cfg)
    from lerobot_cli.trackers import enabled_kinds

    for kind in enabled_kinds(cfg):  # --trackio.enable, --wandb.enable: the extra each needs
        missing = kind.extra and missing_extra_message(kind.extra, f"--{kind.name}.enable=true")
        if missing:
            raise UsageError(missing)


def check_sample_weighting(cfg: TrainConfig) -> None:
    """``--sample_weighting.*`` needs LeRobot's per-sample loss (``forward(batch, reduction="none")``, which
    LeRobot's ACT and Diffusion lack: a TypeError there) and one dataset's global frame ``index`` (what the
    progress file is keyed by; a mixture's items carry each dataset's own)."""
    from lerobot_cli.policies import registry

    flag = f"--sample_weighting.type={cfg.sample_weighting.type}"
    if not spec_of(cfg.policy).per_sample_loss:
        supported = []
        for name in registry.available():
            try:
                if spec_of(registry.config_class(name)).per_sample_loss:
                    supported.append(name)
            except registry.UnknownPolicyError:
                continue
        raise UsageError(
            f"{flag}: policy {cfg.policy.type} has no per-sample loss (LeRobot's forward(batch, "
            f"reduction='none')) to weight; sample weighting supports {', '.join(supported)}"
        )
    if cfg.dataset.is_mixture:
        raise UsageError(
            f"{flag}: a dataset mixture is not weighted here: its frames' index is each dataset's own, the "
            "progress file is one dataset's; train on one --dataset.repo_id"
        )


def simulates(cfg: TrainConfig) -> bool:
    """Whether the run rolls the policy out in a simulation env (LeRobot's ``cfg.env and env_eval_freq``)."""
    return cfg.env is not None and cfg.env_eval_freq > 0


def check_sim_eval(cfg: TrainConfig) -> None:
    """``--env.type``'s extra installed before any work."""
    if not simulates(cfg):
        return
    message = missing_extra_message(cfg.env.extra, f"--env.type={cfg.env.type}")
    if message:
        raise UsageError(message)


def check_extras(cfg: TrainConfig) -> None:
    """The lerobot-cli extras the run needs (its policy's, ``peft`` for ``--peft.*`` and for a saved PEFT
    adapter as ``--policy.path``), each missing one named in one line before any work."""
    from lerobot_cli.peft.basefile import is_adapter_dir  # torch- and peft-free

    needs = [(extra, f"--policy.type={cfg.policy.type}") for extra in spec_of(cfg.policy).extras]
    if cfg.peft is not None:
        needs.append(("peft", "--peft.*"))
    path = cfg.policy.pretrained_path
    if path and is_adapter_dir(path):  # loaded as a peft.PeftModel (its recorded base + the adapter)
        needs.append(("peft", f"--policy.path={path} (a PEFT adapter)"))
    for extra, needed_by in needs:
        message = missing_extra_message(extra, needed_by)
        if message:
            raise UsageError(message)


def check_checkpointing_off(cfg: TrainConfig, flags: dict[str, str]) -> None:
    """``--accelerator.activation_checkpointing.mode=none`` given, while the policy's own
    switch (pi0/pi05's ``gradient_checkpointing``, FastWAM's ``use_gradient_checkpointing``, read as
    ``full``) would turn it on anyway: say which switch to turn off rather than checkpoint silently (a resume
    inherits the policy's field)."""
    given = flags.get("accelerator.activation_checkpointing.mode", "").strip()
    switch = cfg.policy.activation_checkpointing()
    if given == "none" and switch:
        raise UsageError(
            f"--accelerator.activation_checkpointing.mode=none, but {switch}=true (the policy's own switch, "
            f"read as mode=full) turns activation checkpointing on: add {switch}=false to turn it off"
        )


def check_policy_fits_local_dataset(cfg: TrainConfig) -> None:
    """The policy's feature checks against a dataset already on disk (a camera for pi0/pi05, a diffusion
    crop inside the images, ...), before torch: a refusal there costs one line, not a traceback per rank.
    A dataset still to download, or one its reader refuses, is left to the run (it says why)."""
    from lerobot_cli.datasets.errors import DatasetError
    from lerobot_cli.datasets.hub import local_dataset_root
    from lerobot_cli.datasets.mixing import run_meta
    from lerobot_cli.policies.dataset_fit import check_policy_features, policy_config_for_dataset

    try:
        sources = cfg.dataset.sources()
    except ValueError:
        return
    configs = [cfg.dataset.source_config(s) for s in sources] if len(sources) > 1 else [cfg.dataset]
    if any(local_dataset_root(one) is None for one in configs):
        return
    try:
        meta = run_meta(cfg.dataset, local_dataset_root)
    except DatasetError:
        return
    features = meta.features
    if cfg.rename_map:
        from lerobot_cli.rename import check_rename_map, renamed

        try:
            check_rename_map(cfg.rename_map, features, cfg.policy.input_features, meta.root)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        features = renamed(features, cfg.rename_map)
    try:
        policy = policy_config_for_dataset(cfg.policy, features)
    except DatasetError:
        return
    check_policy_features(policy)


def check_custom_code(cfg: TrainConfig) -> None:
    """A tokenizer directory that names its own Python code is refused before torch (never run, never a
    "[y/N]" prompt): the policy's (its ``tokenizer()`` hook: pi0's ``--policy.tokenizer_name``, FastWAM's
    ``--policy.tokenizer_model_id``), and those a ``--policy.path``'s ``policy_preprocessor.json`` names (the
    pipeline it brings). The loader checks again for the rest."""
    from lerobot_ckpt.layout import PREPROCESSOR_CONFIG

    from lerobot_cli.custom_code import CustomCodeError, refuse_custom_code, tokenizers_named_in

    tokenizer = cfg.policy.tokenizer()
    named = [(tokenizer.flag, tokenizer.value)] if tokenizer is not None else []
    if cfg.policy.pretrained_path:
        file = Path(cfg.policy.pretrained_path) / PREPROCESSOR_CONFIG
        named += [(f"{file}: tokenizer_name", name) for name in tokenizers_named_in(file)]
    for setting, name in named:
        try:
            refuse_custom_code(name)
        except CustomCodeError as exc:
            raise UsageError(exc.naming(setting)) from None


def check_external_sources(cfg: TrainConfig) -> None:
    """What the policy reads from outside the dataset and checkpoints and never downloads (its
    ``external_sources()`` hook: FastWAM's frozen VAE, text encoder, tokenizer and base weights), each
    found on this machine before any heavy work, or one line naming its flag and the download (exit 2).
    On a resume the init-only fields are cleared first and the ``initial`` sources skipped (the
    checkpoint's weights replace what they would initialise); a dry run reads none of them."""
    if cfg.dry_run:
        return
    policy = cfg.policy
    if cfg.resume:
        cleared = [name for name in spec_of(policy).init_only_fields if getattr(policy, name) is not None]
        policy = attrs.evolve(policy, **{name: None for name in cleared}) if cleared else policy
    for source in policy.external_sources():
        if cfg.resume and source.initial:  # the checkpoint's weights replace it: never read
            continue
        try:
            source.resolve()
        except ValueError as exc:
            raise UsageError(str(exc)) from None


def check_peft(cfg: TrainConfig) -> None:
    """``--peft.*`` adapts a pretrained base; refuse what would train the wrong thing, before torch."""
    from lerobot_ckpt.errors import CheckpointError
    from lerobot_ckpt.pretrained import pretrained_weights_file, stored_float_dtype

    from lerobot_cli.peft.basefile import PeftSetupError, check_base_precision, is_adapter_dir

    base = cfg.policy.pretrained_path
    if not base:
        raise UsageError(
            "--peft.* adds LoRA adapters to a pretrained policy: pass --policy.path=<base policy dir or "
            "Hub repo id> (--policy.type builds a randomly initialised one)"
        )
    if is_adapter_dir(base):
        raise UsageError(
            f"--policy.path={base} is a PEFT adapter already: drop the --peft.* flags to train that "
            "adapter further, or point --policy.path at its base policy to start a new adapter"
        )
    try:
        check_base_precision(
            stored_float_dtype(pretrained_weights_file(base)),
            cfg.accelerator.mixed_precision,
            f"--policy.path={base}",
        )
    except (CheckpointError, PeftSetupError) as exc:
        raise UsageError(str(exc)) from None

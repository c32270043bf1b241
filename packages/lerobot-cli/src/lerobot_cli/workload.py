"""Dataset, policy and processors of a run, built from its config (the policy learns its features here).

Features come from the dataset unless the policy config (e.g. a ``--policy.path`` fine-tune) already
names them; the frames each batch needs come from the policy's delta indices. Stats from the dataset
(cameras' mean/std ImageNet's by default, as in LeRobot) feed the normalization processors, except when
fine-tuning a policy that ships its own processors.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs
from attrs import define
from lerobot_ckpt.layout import POLICY_CONFIG, POSTPROCESSOR_CONFIG, PREPROCESSOR_CONFIG
from lerobot_parallel.config import AcceleratorConfig, ActivationCheckpointingConfig
from lerobot_parallel.plan import ShardingPlan, build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.sharding import upcast_trainable
from torch import nn

from lerobot_cli.cli.errors import UsageError
from lerobot_cli.config import TrainConfig
from lerobot_cli.custom_code import CustomCodeError
from lerobot_cli.datasets import (
    DatasetError,
    LeRobotDataset,
    dataset_to_policy_features,
    make_dataset,
    resolve_delta_timestamps,
)
from lerobot_cli.datasets.imagenet import with_imagenet_stats
from lerobot_cli.datasets.layout import STATS_PATH
from lerobot_cli.datasets.mixing import MixtureMeta, run_meta
from lerobot_cli.datasets.mixture import MixtureDataset
from lerobot_cli.datasets.split import EpisodeSplit, split_episodes
from lerobot_cli.datasets.stream_location import meta_resolver, remote_dataset
from lerobot_cli.datasets.streamed import StreamedDataset
from lerobot_cli.features import FeatureType, NormalizationMode
from lerobot_cli.peft.basefile import is_adapter_dir
from lerobot_cli.policies.config import PolicyConfig
from lerobot_cli.policies.dataset_fit import check_policy_features, policy_config_for_dataset
from lerobot_cli.policies.registry import spec_of
from lerobot_cli.policies.serialization import load_policy_config
from lerobot_cli.policies.weights import build_policy, load_policy, without_init_only_fields
from lerobot_cli.processors import load_processors, make_pre_post_processors
from lerobot_cli.processors.factory import QUANTILE_STATS_FIX, MissingStatsError
from lerobot_cli.processors.normalize import REQUIRED_STATS
from lerobot_cli.processors.pipeline import ProcessorPipeline
from lerobot_cli.processors.restat import use_dataset_stats
from lerobot_cli.processors.steps import RenameObservationsStep
from lerobot_cli.processors.tokenizer import TokenizerStep, TokenizerUnavailableError
from lerobot_cli.rename import check_rename_map, renamed, show, suggested_map

log = logging.getLogger(__name__)


@define
class Workload:
    dataset: LeRobotDataset  # the training episodes (all but the held-out ones)
    policy_config: PolicyConfig
    policy: nn.Module
    preprocessor: ProcessorPipeline
    postprocessor: ProcessorPipeline
    eval_dataset: LeRobotDataset | None = None  # --dataset.eval_split's held-out episodes
    split: EpisodeSplit | None = None


def _datasets(
    cfg: TrainConfig, meta, delta
) -> tuple[LeRobotDataset, LeRobotDataset | None, EpisodeSplit | None]:
    """The training dataset and, with ``--dataset.eval_split``, the held-out one (disjoint episodes)."""
    # uint8 cameras, as LeRobot's training factory asks for: the runner makes them float on the device
    if cfg.dataset.eval_split == 0:
        return (
            make_dataset(cfg.dataset, delta_timestamps=delta, return_uint8=True, tolerance_s=cfg.tolerance_s),
            None,
            None,
        )
    split = split_episodes(meta.select(cfg.dataset.episodes), cfg.dataset.eval_split)
    for task in split.whole_tasks:
        log.warning(
            "task %r has too few episodes to keep one for training at --dataset.eval_split=%s: all of them "
            "are held out (LeRobot's rule)",
            task,
            cfg.dataset.eval_split,
        )
    root = meta.root
    return (
        LeRobotDataset(
            root, episodes=split.train, delta_timestamps=delta, return_uint8=True, tolerance_s=cfg.tolerance_s
        ),
        LeRobotDataset(
            root, episodes=split.eval, delta_timestamps=delta, return_uint8=True, tolerance_s=cfg.tolerance_s
        ),
        split,
    )


def _delta(features: dict, fps: float, policy_cfg: PolicyConfig) -> dict[str, list[float]] | None:
    return resolve_delta_timestamps(
        features,
        fps,
        observation_delta_indices=policy_cfg.observation_delta_indices,
        action_delta_indices=policy_cfg.action_delta_indices,
        reward_delta_indices=policy_cfg.reward_delta_indices,
    )


def _mixture(
    cfg: TrainConfig, meta: MixtureMeta, policy_cfg: PolicyConfig
) -> tuple[MixtureDataset, MixtureDataset | None, EpisodeSplit | None]:
    """The mixture's datasets, each with the policy's windows at its own fps, under its own names; with
    ``--dataset.eval_split``, each dataset split as one dataset is (per task, its last episodes), the
    held-out parts a mixture of their own."""
    train, held, splits = [], [], []
    for part, source in zip(meta.parts, meta.sources, strict=True):
        delta = _part_delta(meta, part, source, policy_cfg)
        if not cfg.dataset.eval_split:
            train.append(
                LeRobotDataset(
                    part.root,
                    episodes=source.episodes,
                    delta_timestamps=delta,
                    return_uint8=True,
                    tolerance_s=cfg.tolerance_s,
                )
            )
            continue
        split = split_episodes(part.select(source.episodes), cfg.dataset.eval_split)
        for task in split.whole_tasks:
            log.warning(
                "dataset %r: task %r has too few episodes to keep one for training at "
                "--dataset.eval_split=%s: all of them are held out (LeRobot's rule)",
                source.name,
                task,
                cfg.dataset.eval_split,
            )
        splits.append(split)
        for episodes, into in ((split.train, train), (split.eval, held)):
            into.append(
                LeRobotDataset(
                    part.root,
                    episodes=episodes,
                    delta_timestamps=delta,
                    return_uint8=True,
                    tolerance_s=cfg.tolerance_s,
                )
            )
    if not splits:
        return MixtureDataset(train, meta.sources), None, None
    together = EpisodeSplit(
        train=tuple(e for s in splits for e in s.train),
        eval=tuple(e for s in splits for e in s.eval),
        tasks=len(meta.tasks),
        whole_tasks=tuple(t for s in splits for t in s.whole_tasks),
    )
    return MixtureDataset(train, meta.sources), MixtureDataset(held, meta.sources), together


def _part_delta(meta: MixtureMeta, part, source, policy_cfg: PolicyConfig) -> dict[str, list[float]] | None:
    """The policy's windows for one dataset of a mixture: at its own fps, under its own feature names."""
    mixture_delta = _delta(meta.features, part.fps, policy_cfg) or {}
    own_name = {source.rename.get(k, k): k for k in part.features}
    return {own_name[k]: v for k, v in mixture_delta.items()} or None


def _streamed(cfg: TrainConfig, meta, policy_cfg: PolicyConfig) -> StreamedDataset:
    """``--dataset.streaming=true``: one ``EpisodeReader`` per dataset (only ``meta/`` is read now)."""
    from lerobot_cli.datasets.episode_reader import EpisodeReader

    drop = policy_cfg.frames_dropped_per_episode()
    if isinstance(meta, MixtureMeta):
        parts = [
            EpisodeReader(
                part.root,
                source.episodes,
                _part_delta(meta, part, source, policy_cfg),
                tolerance_s=cfg.tolerance_s,
                return_uint8=True,
                files=remote_dataset(cfg.dataset.source_config(source)),
            )
            for part, source in zip(meta.parts, meta.sources, strict=True)
        ]
        return StreamedDataset(parts, meta.sources, drop_last=drop)
    delta = _delta(meta.features, meta.fps, policy_cfg)
    reader = EpisodeReader(
        meta.root,
        cfg.dataset.episodes,
        delta,
        tolerance_s=cfg.tolerance_s,
        return_uint8=True,
        files=remote_dataset(cfg.dataset),
    )
    return StreamedDataset([reader], drop_last=drop)


def features_are_derived(policy: PolicyConfig) -> bool:
    """Whether ``policy``'s features are the ones its class fills in when none are given (FastWAM's, as
    LeRobot's config derives them: one camera at the full image size, the state and action of its flags):
    nobody fixed them, so the dataset replaces them (``fit_dataset``) instead of having to match them."""
    fresh = attrs.evolve(policy, input_features={}, output_features={})
    return (fresh.input_features, fresh.output_features) == (policy.input_features, policy.output_features)


def check_features_fit(
    policy: PolicyConfig, features: dict, root: Path, source: str, rename_map: dict[str, str] | None = None
) -> None:
    """A policy whose features were fixed elsewhere (a checkpoint, ``--policy.path``) must find them in
    the dataset: otherwise it fails later as a shape error deep in the model, or as weights that
    "do not match", neither of which names the real cause (another dataset). Inputs the policy fills in
    itself (LeRobot's empty-camera placeholders in a pi0 ``config.json``) need not be in the dataset.
    ``features``: the dataset's after ``rename_map`` (``--rename_map``); a missing input that another
    observation of the dataset could feed is named with the ``--rename_map`` that would do it."""
    available = dataset_to_policy_features(features)
    placeholders = set(policy.placeholder_inputs())
    problems, missing = [], []
    for key, feature in {**policy.input_features, **policy.output_features}.items():
        have = available.get(key)
        if have is None and key in placeholders:
            continue
        if have is None:
            problems.append(f"{key} is missing")
            missing.append(key)
        elif feature.type is FeatureType.VISUAL and have.shape[:1] != feature.shape[:1]:
            problems.append(f"{key} has {have.shape[0]} channels, not {feature.shape[0]}")
        elif feature.type is not FeatureType.VISUAL and have.shape != feature.shape:
            problems.append(f"{key} has shape {list(have.shape)}, not {list(feature.shape)}")
    if problems:
        suggestion = suggested_map(
            [k for k in missing if k in policy.input_features], policy.input_features, available, rename_map
        )
        rename = (
            f"; if the dataset names it otherwise, rename it: {show(suggestion)}"
            if suggestion is not None and policy.pretrained_path
            else ""
        )
        raise DatasetError(
            f"the dataset at {root} does not fit the {policy.type} policy of {source}: "
            f"{'; '.join(problems)}{rename}; use the dataset that policy was trained on, "
            "or train a new policy with --policy.type"
        )


def _has_processors(directory: Path) -> bool:
    return (directory / PREPROCESSOR_CONFIG).is_file() and (directory / POSTPROCESSOR_CONFIG).is_file()


def build_policy_for(
    cfg: TrainConfig, features: dict, resuming: bool = False
) -> tuple[PolicyConfig, nn.Module]:
    """The policy a run trains: fresh, or loaded from ``--policy.path``; features from the dataset.

    With ``--peft.*`` the ``--policy.path`` policy is the frozen base of new LoRA adapters; a
    ``--policy.path`` that is itself a PEFT output trains its adapter further (on its recorded base).
    ``resuming``: the checkpoint's weights replace whatever the policy starts with, so a full fine-tune
    does not read its original ``--policy.path`` weights again (they may have moved or been deleted)
    and nothing is initialised from pretrained files; a PEFT run still needs its frozen base.
    """
    policy_cfg = policy_config_for_dataset(cfg.policy, features)
    check_policy_features(policy_cfg)  # before any weight is built (the CLI checked already if it could)
    precision = cfg.accelerator.mixed_precision
    peft_run = cfg.peft is not None or bool(
        policy_cfg.pretrained_path and is_adapter_dir(policy_cfg.pretrained_path)
    )
    if resuming and not peft_run:
        policy = build_policy(without_init_only_fields(policy_cfg), initialise=False)
        return policy_cfg, fp32_masters(policy, precision)
    if policy_cfg.pretrained_path:
        directory = Path(policy_cfg.pretrained_path)
        if is_adapter_dir(directory):
            from lerobot_cli.peft.adapters import load_adapter_policy

            return load_adapter_policy(
                directory, config=policy_cfg, trainable=True, mixed_precision=precision
            )
        policy_cfg, policy = load_policy(directory, config=policy_cfg)
        if cfg.peft is not None:
            from lerobot_cli.peft.adapters import wrap_with_peft

            return policy_cfg, wrap_with_peft(
                policy.train(), cfg.peft, base_dir=directory, mixed_precision=precision
            )
        return policy_cfg, fp32_masters(policy.train(), precision)
    return policy_cfg, fp32_masters(build_policy(policy_cfg), precision)


def fp32_masters(policy: nn.Module, mixed_precision: str) -> nn.Module:
    """Under ``--accelerator.mixed_precision`` the optimizer updates fp32 masters in every layout: FSDP2
    upcasts trainable parameters before sharding, and this does it for one process and DDP, so a
    ``--policy.dtype=bfloat16`` pi0 trains fp32 masters under bf16 autocast there too (frozen parameters
    keep their dtype and memory). Without mixed precision its bf16 values are updated, as in LeRobot."""
    if mixed_precision != "no":
        upcast_trainable(policy)
    return policy


def build_workload(
    cfg: TrainConfig, device: str, processors_from: Path | None = None, resuming: bool = False
) -> Workload:
    """``processors_from``: a ``pretrained_model/`` whose processors to use (a resumed checkpoint);
    ``resuming``: its weights will be loaded over the policy (see ``build_policy_for``)."""
    meta = run_meta(cfg.dataset, meta_resolver(cfg.dataset))
    root = meta.root
    reference, source = (
        cfg.policy,
        (
            f"--policy.path={cfg.policy.pretrained_path}"
            if cfg.policy.pretrained_path
            else "--policy.input_features/output_features"
        ),
    )
    if resuming and processors_from is not None and (processors_from / POLICY_CONFIG).is_file():
        # the features the checkpoint's weights were built for
        # (train_config.json may leave them to the dataset)
        reference, source = (
            load_policy_config(processors_from / POLICY_CONFIG),
            "the checkpoint being resumed",
        )
    features = meta.features
    if cfg.rename_map:
        try:
            check_rename_map(cfg.rename_map, features, cfg.policy.input_features, root)
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        features = renamed(features, cfg.rename_map)  # the names the policy sees
    if (reference.input_features or reference.output_features) and not features_are_derived(reference):
        check_features_fit(reference, features, root, source, cfg.rename_map)
    policy_cfg, policy = build_policy_for(cfg, features, resuming)
    if cfg.dataset.streaming:
        dataset, eval_dataset, split = _streamed(cfg, meta, policy_cfg), None, None
    elif isinstance(meta, MixtureMeta):
        dataset, eval_dataset, split = _mixture(cfg, meta, policy_cfg)
    else:
        delta = _delta(meta.features, meta.fps, policy_cfg)
        dataset, eval_dataset, split = _datasets(cfg, meta, delta)
    pretrained = Path(policy_cfg.pretrained_path) if policy_cfg.pretrained_path else None
    source = processors_from or pretrained
    if source is not None and _has_processors(source):
        pre, post = load_processors(source, device=device)
        # as LeRobot's override of a pretrained pre-processor: this run's map (``{}`` clears a saved one)
        set_rename_map(pre, cfg.rename_map, source / PREPROCESSOR_CONFIG)
        if processors_from is None:  # a --policy.path fine-tune, not a resume: the dataset's stats
            try:
                use_dataset_stats(pre, post, policy_cfg, processor_stats(cfg, dataset))
            except MissingStatsError as exc:
                raise DatasetError(stats_error_message(dataset.meta.root / STATS_PATH, exc)) from None
    else:
        try:
            pre, post = make_pre_post_processors(
                policy_cfg, processor_stats(cfg, dataset), device=device, rename_map=cfg.rename_map
            )
        except MissingStatsError as exc:
            raise DatasetError(stats_error_message(dataset.meta.root / STATS_PATH, exc)) from None
        source = None
    named_by = (
        "--policy.tokenizer_name" if source is None else f"{source / PREPROCESSOR_CONFIG}: tokenizer_name"
    )
    _load_tokenizers(pre, named_by)
    return Workload(dataset, policy_cfg, policy, pre, post, eval_dataset, split)


def _load_tokenizers(pre, setting: str) -> None:
    """Load the pre-processor's tokenizers now: a tokenizer that cannot be found (or that comes with its
    own code) must stop the run at start-up with its one sentence, not at the first batch after the model
    was built and sharded. ``setting``: what named the tokenizer (the flag, or the pipeline file)."""
    for step in pre.steps:
        if isinstance(step, TokenizerStep):
            try:
                step.tokenizer  # noqa: B018 - the property loads it
            except (TokenizerUnavailableError, CustomCodeError) as exc:
                raise UsageError(exc.naming(setting)) from None


def processor_stats(cfg: TrainConfig, dataset: LeRobotDataset) -> dict:
    """The statistics new processors are built from: the dataset's, with ImageNet's camera mean/std under
    ``--dataset.use_imagenet_stats`` (LeRobot's default, applied where LeRobot's dataset factory does),
    renamed by ``--rename_map``."""
    stats = dataset.meta.stats
    if cfg.dataset.use_imagenet_stats:
        stats = with_imagenet_stats(stats, dataset.meta.features)
    return renamed(stats, cfg.rename_map)  # under the policy's names (LeRobot's rename_stats)


def set_rename_map(pre: ProcessorPipeline, rename_map: dict[str, str], file: Path) -> None:
    """Give the loaded pre-processor's ``rename_observations_processor`` step ``rename_map``."""
    steps = [step for step in pre.steps if isinstance(step, RenameObservationsStep)]
    if not steps:
        if rename_map:
            raise DatasetError(
                f"--rename_map: {file} has no rename_observations_processor step to rename the dataset's "
                "observations with"
            )
        return
    for step in steps:
        step.rename_map = dict(rename_map)


def stats_error_message(path: Path, exc: MissingStatsError) -> str:
    """One sentence: which feature lacks which statistic in ``path``, why the policy needs it, and the
    two valid ways out (complete statistics, or no normalization for that feature type)."""
    by_feature: dict[str, list[str]] = {}
    for key, stat in exc.missing:
        by_feature.setdefault(key, []).append(stat)
    lacks = "; ".join(
        f"no statistics for {key!r}" if key in exc.absent else f"{key!r} has no {', '.join(map(repr, stats))}"
        for key, stats in by_feature.items()
    )
    types = list(dict.fromkeys(exc.feature_types[k] for k in by_feature))
    needs = "; ".join(
        f"{t} features are normalized with {exc.mapping[t]}, which needs "
        f"{' and '.join(REQUIRED_STATS[NormalizationMode(exc.mapping[t])])}"
        for t in types
    )
    supported = json.dumps(exc.supported_mapping)
    quantiles = any(stat.startswith("q") for _, stat in exc.missing)
    recompute = f" ({QUANTILE_STATS_FIX})" if quantiles else ""
    return (
        f"{path}: {lacks} ({needs}); valid: --policy.normalization_mapping='{supported}' (modes these "
        f"statistics support), or {path.name} with those statistics for every normalized feature{recompute}"
    )


def effective_accelerator(cfg: TrainConfig) -> AcceleratorConfig:
    """``cfg.accelerator`` with the policy's own ``gradient_checkpointing=true`` (pi0/pi05, as in LeRobot)
    read as ``accelerator.activation_checkpointing.mode=full``: one mechanism, applied per wrap unit by
    lerobot-parallel. An explicit mode (selective) wins."""
    acc = cfg.accelerator
    if cfg.policy.activation_checkpointing() and not acc.activation_checkpointing.enabled:
        return attrs.evolve(acc, activation_checkpointing=ActivationCheckpointingConfig(mode="full"))
    return acc


def sharding_plan(cfg: TrainConfig, policy, runtime: ParallelRuntime) -> ShardingPlan:
    """Wrap units, tied-weight check, precision, memory estimate, activation checkpointing and compile
    regions; refusals happen here, before work."""
    spec = spec_of(cfg.policy)  # the policy's own class, also under a PEFT wrapper
    # Every FSDP need passed explicitly, empty ones too: lerobot-parallel then reads none of the model
    # classes' _fsdp_* attributes (its fallback for trainers without a spec).
    return build_plan(
        policy,
        runtime,
        effective_accelerator(cfg),
        default_wrap_modules=list(spec.wrap_units or ()),
        default_unit_groups=list(spec.unit_groups),
        default_no_forward_modules=list(spec.no_forward_modules),
        default_wrap_modules_source=f"the {cfg.policy.type} policy's PolicySpec.wrap_units",
    )

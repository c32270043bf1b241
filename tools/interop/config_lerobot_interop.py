r"""Check that every ``config.json`` we write parses with LeRobot's own parser and means the same to it.

LeRobot's ``PreTrainedConfig.from_pretrained`` (draccus) refuses a ``config.json`` with a key its dataclass
lacks, and runs the class's ``__post_init__`` checks on the values. Our settings LeRobot lacks therefore go to
``config_extensions.json`` (``lerobot_cli.policies.extensions``); this driver checks the result for every
policy and, one field at a time, every setting we accept:

1. ours-write     (our env, torch-free) for each policy and each field, configs with that field at other
                  values than its default (every choice of a choice field) that our validators accept, saved
                  with ``save_policy_config``; each read back with ``load_policy_config`` must equal the
                  config, and our fields LeRobot lacks (the spec's ``extension_fields``: pi0's
                  ``tokenizer_name``, FastWAM's ``variant`` …) must be in ``config_extensions.json`` with the
                  config's values, never in ``config.json``. The cameras are ``observation.wrist_rgb`` and
                  ``observation.top``: no ``observation.images`` prefix, listed wrist first (LeRobot keeps the
                  config's order).
2. lerobot-check  (LeRobot env) ``PreTrainedConfig.from_pretrained`` on each directory: it must parse, and
                  every value we wrote must be the value LeRobot's parsed config holds (nested dicts: every
                  key we wrote; ``device`` aside, which LeRobot's ``__post_init__`` moves to an available
                  device). A tiny pi0/pi05 (``paligemma_variant=gemma_tiny``, which LeRobot cannot build) must
                  be refused with LeRobot's own message (``TINY_REFUSAL``), never parsed into something else,
                  and an ``mlp`` (LeRobot has no such policy) by its type. Each parsed config is then written
                  by LeRobot's own ``_save_pretrained`` (what its ``save_pretrained`` writes) into
                  ``<case>/lerobot``.
3. ours-read      (our env) each of those LeRobot-written ``config.json`` files, read by
                  ``load_policy_config``, must equal the config of step 1 with our extension fields at their
                  defaults (LeRobot's file has no sidecar; ``device`` aside): the other direction.
4. lerobot-fields (LeRobot env) writes the dataclass fields of LeRobot's config class for each ``--policy``
                  type (null for a type LeRobot lacks) to FILE; ``run`` passes every registered policy and
                  compares them with the list the unit tests pin
                  (packages/lerobot-cli/tests/data/lerobot_config_fields.json).

The policies are our registry's (``lerobot_cli.policies.manifest``: built-ins, plugins), read in our env and
handed to LeRobot's in the manifest and on the command line: a new policy is checked without an edit here.
Whether LeRobot has its type is its spec's ``in_lerobot``: a type LeRobot lacks (``mlp``) must be refused by
its type, and ``lerobot-fields`` must find no class for it.

    uv run python tools/interop/config_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PINNED_FIELDS = REPO / "packages" / "lerobot-cli" / "tests" / "data" / "lerobot_config_fields.json"
# LeRobot refuses a tiny pi0/pi05 on purpose: it has no such model (and vision_variant=tiny, which is not in
# config.json, is only accepted with gemma_tiny, so LeRobot never reads a tiny SigLIP as so400m).
TINY_REFUSAL = "Invalid paligemma_variant: gemma_tiny"
CAMERAS = {"observation.wrist_rgb": (3, 96, 96), "observation.top": (3, 96, 96)}
CAMERAS_UNEQUAL = {
    "observation.wrist_rgb": (3, 64, 80),
    "observation.top": (3, 96, 96),
}  # diffusion needs equal
# FastWAM's two cameras, concatenated along the width into image_size (see _fastwam_features).
FASTWAM_CAMERAS = ("observation.wrist_rgb", "observation.top")


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def registered() -> dict[str, bool]:
    """Every policy of our registry -> whether LeRobot 0.6.1 has its type (the spec's ``in_lerobot``)."""
    from lerobot_cli.policies import manifest

    return {name: meta["in_lerobot"] for name, meta in manifest.policies().items()}


def unknown_to_lerobot(policy: str) -> str:
    """LeRobot's refusal of a policy type it has no class for: our config.json keeps every field there."""
    return f"Policy type '{policy}'"


def _features(policy: str) -> dict[str, Any]:
    from lerobot_cli.features import PolicyFeature

    if policy == "fastwam":
        return _fastwam_features()
    cameras = CAMERAS if policy == "diffusion" else CAMERAS_UNEQUAL
    inputs = {
        "observation.state": PolicyFeature("STATE", (6,)),
        **{k: PolicyFeature("VISUAL", shape) for k, shape in cameras.items()},
    }
    return {"input_features": inputs, "output_features": {"action": PolicyFeature("ACTION", (6,))}}


def _fastwam_features(state: int = 8, action: int = 7, size: tuple[int, int] = (224, 448)) -> dict[str, Any]:
    """FastWAM's features as LeRobot's ``validate_features`` wants them for these settings (its
    ``__post_init__`` refuses a config.json whose features disagree): the state ``proprio_dim`` wide, the
    action ``action_dim`` wide, both cameras ``image_size[0]`` high and half ``image_size[1]`` wide."""
    from lerobot_cli.features import PolicyFeature

    height, width = size
    cameras = {name: PolicyFeature("VISUAL", (3, height, width // 2)) for name in FASTWAM_CAMERAS}
    return {
        "input_features": {"observation.state": PolicyFeature("STATE", (state,)), **cameras},
        "output_features": {"action": PolicyFeature("ACTION", (action,))},
    }


def _fastwam_cases() -> dict[str, list[dict[str, Any]]]:
    """FastWAM's fields whose other values are choices, None, strings, dicts or tied to another field
    (LeRobot's timing rules: (num_video_frames - 1) / action_video_freq_ratio transitions, a multiple of 4
    dividing action_horizon). They take precedence over the shared cases of the same name."""
    from lerobot_cli.policies.fastwam.config import TORCH_DTYPES, VARIANTS
    from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs

    video, action = tiny_dit_configs(7)
    conditioned = {
        **video,
        "action_conditioned": True,
        "video_attention_mask_mode": "per_frame_causal",
        "action_group_causal_mask_mode": "group_diagonal",
    }
    return {
        "action_dim": [
            {"action_dim": 6, **_fastwam_features(action=6)},
            {"action_dim": 14, **_fastwam_features(action=14)},
        ],
        "proprio_dim": [{"proprio_dim": None}, {"proprio_dim": 6, **_fastwam_features(state=6)}],
        "num_video_frames": [
            {"num_video_frames": 17, "action_video_freq_ratio": 2},
            {"num_video_frames": 65, "action_video_freq_ratio": 2},
        ],
        "image_size": [
            {"image_size": (256, 512), **_fastwam_features(size=(256, 512))},
            {"image_size": (32, 64), **_fastwam_features(size=(32, 64))},
        ],
        "model_id": [{"model_id": "/models/Wan2.2-TI2V-5B"}],
        "tokenizer_model_id": [
            {"tokenizer_model_id": "/data/tokenizers/umt5"},
            {"tokenizer_model_id": "someone/umt5-tokenizer"},
        ],
        "text_encoder_model_id": [{"text_encoder_model_id": "/models/Wan2.2-TI2V-5B-Diffusers"}],
        "base_model_id": [{"base_model_id": None}, {"base_model_id": "/checkpoints/base/pretrained_model"}],
        "torch_dtype": [{"torch_dtype": d} for d in TORCH_DTYPES],
        "prompt_template": [{"prompt_template": "Robot, please: {task}"}],
        "inference_seed": [{"inference_seed": None}, {"inference_seed": 7}],
        "rand_device": [{"rand_device": "cuda"}],
        "negative_prompt": [{"negative_prompt": "blurry, static"}],
        "sigma_shift": [{"sigma_shift": 2.5}],
        "variant": [{"variant": v} for v in VARIANTS],
        "toggle_action_dimensions": [
            {"toggle_action_dimensions": [-1]},
            {"toggle_action_dimensions": [0, 5]},
        ],
        "video_scheduler": [
            {"video_scheduler": {"train_shift": 3.0, "infer_shift": 7.0, "num_train_timesteps": 800}}
        ],
        "action_scheduler": [
            {"action_scheduler": {"train_shift": 2.0, "infer_shift": 6.0, "num_train_timesteps": 500}}
        ],
        "loss": [
            {"loss": {"lambda_video": 0.5, "lambda_action": 2.0}},
            {"loss": {"lambda_video": 0.0, "lambda_action": 1.0}},
        ],
        "video_dit_config": [
            {"video_dit_config": video, "action_dit_config": action},
            {"video_dit_config": conditioned, "action_dit_config": action},
        ],
        "action_dit_config": [
            {"action_dit_config": {**action, "ffn_dim": 2 * action["ffn_dim"]}, "video_dit_config": video}
        ],
    }


def _special_cases() -> dict[str, list[dict[str, Any]]]:
    """Fields whose other values are choices, need a companion setting, or are not plain numbers."""
    from lerobot_cli.features import NormalizationMode
    from lerobot_cli.policies.act.config import FEEDFORWARD_ACTIVATIONS
    from lerobot_cli.policies.act.config import SUPPORTED_BACKBONES as ACT_BACKBONES
    from lerobot_cli.policies.common.paligemma.config import DTYPES
    from lerobot_cli.policies.common.paligemma.variants import GEMMA_VARIANTS, VISION_VARIANTS
    from lerobot_cli.policies.diffusion.config import (
        BETA_SCHEDULES,
        LR_SCHEDULERS,
        NOISE_SCHEDULERS,
        PREDICTION_TYPES,
    )

    modes = [m.value for m in NormalizationMode]
    return {
        "vision_backbone": [{"vision_backbone": b} for b in ACT_BACKBONES],
        "replace_final_stride_with_dilation": [
            {"replace_final_stride_with_dilation": True, "vision_backbone": "resnet50"}
        ],
        "feedforward_activation": [{"feedforward_activation": a} for a in FEEDFORWARD_ACTIVATIONS],
        "temporal_ensemble_coeff": [{"temporal_ensemble_coeff": 0.01, "n_action_steps": 1}],
        "pretrained_backbone_weights": [
            {"pretrained_backbone_weights": None},
            {"pretrained_backbone_weights": "/weights/resnet18.pth"},
        ],
        "prediction_type": [{"prediction_type": p} for p in PREDICTION_TYPES],
        "noise_scheduler_type": [{"noise_scheduler_type": n} for n in NOISE_SCHEDULERS],
        "beta_schedule": [{"beta_schedule": b} for b in BETA_SCHEDULES],
        "scheduler_name": [{"scheduler_name": s} for s in LR_SCHEDULERS],
        "resize_shape": [{"resize_shape": (80, 72)}, {"resize_shape": (80, 72), "crop_ratio": 0.8}],
        "crop_shape": [{"crop_shape": None}, {"crop_shape": (64, 64)}],
        "crop_ratio": [{"crop_ratio": 0.5, "resize_shape": (96, 96)}],
        "use_group_norm": [{"use_group_norm": True, "pretrained_backbone_weights": None}],
        "num_inference_steps": [{"num_inference_steps": 10}, {"num_inference_steps": 5}],
        "down_dims": [{"down_dims": (256, 512)}, {"down_dims": (64, 128, 256, 512)}],
        "paligemma_variant": [
            {"paligemma_variant": v, "action_expert_variant": v}
            if v == "gemma_tiny"
            else {"paligemma_variant": v}
            for v in GEMMA_VARIANTS
        ],
        "action_expert_variant": [{"action_expert_variant": v} for v in GEMMA_VARIANTS if v != "gemma_tiny"],
        "vision_variant": [{"vision_variant": v} for v in VISION_VARIANTS]
        + [
            {"vision_variant": v, "paligemma_variant": "gemma_tiny", "action_expert_variant": "gemma_tiny"}
            for v in VISION_VARIANTS
        ],
        "dtype": [{"dtype": d} for d in DTYPES],
        "tokenizer_name": [
            {"tokenizer_name": "/data/tokenizers/paligemma_local"},
            {"tokenizer_name": "someone/another-tokenizer"},
        ],
        "image_resolution": [{"image_resolution": (112, 112)}],
        "resize_imgs_with_padding": [
            {"resize_imgs_with_padding": (320, 256)},
            {"resize_imgs_with_padding": None},  # refused: LeRobot's parser refuses it
        ],
        "attention_mode": [{"attention_mode": "self_attn"}],
        "pad_language_to": [{"pad_language_to": "max_length"}],
        "vlm_model_name": [
            {"vlm_model_name": "/data/vlm/smolvlm_local"},
            {"vlm_model_name": "HuggingFaceTB/SmolVLM2-256M-Video-Instruct"},
        ],
        "num_expert_layers": [
            {"num_expert_layers": 1},
            {"num_expert_layers": 4, "self_attn_every_n_layers": 8},
        ],
        "rtc_config": [
            {"rtc_config": {"enabled": False}},
            {"rtc_config": {}},
            {"rtc_config": {"enabled": False, "not_an_rtc_field": 1}},
            {"rtc_config": {"enabled": False, "execution_horizon": 5, "max_guidance_weight": 5.0}},
        ],
        "relative_exclude_joints": [
            {"relative_exclude_joints": []},
            {"relative_exclude_joints": ["gripper", "wrist"]},
        ],
        "action_feature_names": [{"action_feature_names": [f"joint_{i}" for i in range(6)]}],
        "compile_mode": [{"compile_mode": "default"}],
        "normalization_mapping": [
            {"normalization_mapping": {"VISUAL": m, "STATE": m, "ACTION": m}} for m in modes
        ],
        "input_features": [{"input_features": {}}],
        "output_features": [{"output_features": {}}],
        "device": [{"device": "cpu"}, {"device": "cuda"}],
        "use_amp": [{"use_amp": True}],
        "repo_id": [{"repo_id": "someone/policy"}],
        "private": [{"private": True}, {"private": False}],
        "tags": [{"tags": ["robot", "test"]}],
        "license": [{"license": "apache-2.0"}],
        "pretrained_path": [{"pretrained_path": "/checkpoints/005000/pretrained_model"}],
        "pretrained_revision": [{"pretrained_revision": "main"}],
    }


def _generic_cases(name: str, default: Any) -> list[dict[str, Any]]:
    if isinstance(default, bool):
        return [{name: not default}]
    if isinstance(default, int):
        return [{name: default + 1}, {name: default * 2}, {name: 1}]
    if isinstance(default, float):
        return [{name: default * 0.5 if default else 0.5}]
    if isinstance(default, tuple) and all(isinstance(v, float) for v in default):
        return [{name: tuple(v * 0.5 for v in default)}]
    return []


def cases_for(policy: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """``[(field, overrides)]`` for one policy, with the default config first; and the fields no other value
    of which our validators accept (reported, so a field never goes unchecked unnoticed)."""
    import attrs
    from lerobot_cli.policies import registry

    cls = registry.config_class(policy)
    base = cls(**_features(policy))
    special = {**_special_cases(), **(_fastwam_cases() if policy == "fastwam" else {})}
    cases, uncovered = [("default", {})], []
    for a in attrs.fields(cls):
        candidates = special.get(a.name) or _generic_cases(a.name, getattr(base, a.name))
        accepted = 0
        for overrides in candidates:
            try:
                cls(**{**_features(policy), **overrides})
            except ValueError:
                continue
            accepted += 1
            cases.append((a.name, overrides))
        if not accepted:
            uncovered.append(a.name)
    return cases, uncovered


def _sidecar_problems(cfg: Any, directory: Path) -> list[str]:
    """Our fields LeRobot lacks must be in ``config_extensions.json`` with the config's values (and ``type``),
    never in ``config.json``; a policy without such fields writes no sidecar."""
    ours = type(cfg).spec.extension_fields
    written = json.loads((directory / "config.json").read_text())
    sidecar = directory / "config_extensions.json"
    problems = [f"{name} is in config.json" for name in ours if name in written]
    if not ours:
        return problems + (["a config_extensions.json was written"] if sidecar.exists() else [])
    if not sidecar.exists():
        return [*problems, "no config_extensions.json"]
    expected = json.loads(json.dumps({"type": cfg.type, **{n: getattr(cfg, n) for n in ours}}, default=list))
    extra = json.loads(sidecar.read_text())
    if extra != expected:
        problems.append(f"config_extensions.json holds {extra}, expected {expected}")
    return problems


def _jsonable(value: Any) -> Any:
    """A manifest's view of a setting: a feature as its repr, any other iterable as a list."""
    try:
        return list(value)
    except TypeError:
        return repr(value)


def ours_write(work: Path) -> bool:
    from lerobot_cli.policies import registry
    from lerobot_cli.policies.serialization import load_policy_config, save_policy_config

    manifest, ok = [], True
    for policy, in_lerobot in registered().items():
        cls = registry.config_class(policy)
        cases, uncovered = cases_for(policy)
        for i, (name, overrides) in enumerate(cases):
            cfg = cls(**{**_features(policy), **overrides})
            directory = work / f"{policy}-{i:03d}-{name}"
            save_policy_config(cfg, directory)
            back = load_policy_config(directory)
            if back != cfg:
                ok = False
                print(f"[ours] {directory.name}: read back differs from what was saved")
            for problem in _sidecar_problems(cfg, directory):
                ok = False
                print(f"[ours] {directory.name}: {problem}")
            expect = TINY_REFUSAL if overrides.get("paligemma_variant") == "gemma_tiny" else None
            manifest.append(
                {
                    "dir": directory.name,
                    "policy": policy,
                    "field": name,
                    "setting": json.loads(json.dumps(overrides, default=_jsonable)),
                    "expect_refusal": expect if in_lerobot else unknown_to_lerobot(policy),
                }
            )
        print(
            f"[ours] {policy}: {len(cases)} configs written; fields with no other accepted value: "
            f"{', '.join(uncovered) or 'none'}"
        )
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return ok


def _as_json(cfg: Any) -> dict[str, Any]:
    from lerobot_cli.policies.serialization import policy_config_extensions, policy_config_to_dict

    return json.loads(json.dumps({**policy_config_to_dict(cfg), **policy_config_extensions(cfg)}))


def ours_read(work: Path) -> bool:
    """LeRobot's ``config.json`` for every case it parsed, read by us: the case's config with our extension
    fields at their defaults (LeRobot writes no sidecar); ``device`` aside (LeRobot moved it)."""
    import attrs
    from lerobot_cli.policies import registry
    from lerobot_cli.policies.serialization import load_policy_config

    manifest = json.loads((work / "manifest.json").read_text())
    checked, failed, completed = 0, [], 0
    for case in manifest:
        directory = work / case["dir"] / "lerobot"
        if case["expect_refusal"]:
            continue
        if not (directory / "config.json").is_file():
            failed.append(f"{case['dir']}: LeRobot wrote no config.json")
            continue
        cls = registry.config_class(case["policy"])
        cfg = load_policy_config(work / case["dir"])
        defaults = {a.name: a.default for a in attrs.fields(cls) if a.name in cls.spec.extension_fields}
        expected = attrs.evolve(cfg, **defaults)
        try:
            theirs = load_policy_config(directory)
        except Exception as exc:  # noqa: BLE001 - reported with its message
            failed.append(f"{case['dir']} {case['setting']}: we refuse LeRobot's config.json ({exc})")
            continue
        theirs = attrs.evolve(theirs, device=expected.device)
        if theirs == expected:
            checked += 1
            continue
        # a nested dict LeRobot completes with its defaults (pi0's rtc_config) differs only in those keys
        differ = _subset_mismatches(_as_json(expected), _as_json(theirs), "config")
        if differ:
            failed.append(f"{case['dir']} {case['setting']}: {'; '.join(differ)}")
        else:
            checked += 1
            completed += 1
    for line in failed:
        print(f"[ours-read] FAIL {line}")
    print(
        f"[ours-read] {checked} LeRobot-written config.json files read back as the configs LeRobot parsed "
        f"({completed} with nested dicts LeRobot completed with its defaults)"
    )
    return not failed


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _subset_mismatches(ours: Any, theirs: Any, where: str) -> list[str]:
    """Where ``theirs`` differs from ``ours`` on what ``ours`` says (keys LeRobot adds are its defaults)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        out = []
        for key, value in ours.items():
            if key not in theirs:
                out.append(f"{where}.{key}: missing in LeRobot's config")
            else:
                out += _subset_mismatches(value, theirs[key], f"{where}.{key}")
        return out
    return [] if ours == theirs else [f"{where}: ours {ours!r}, LeRobot's {theirs!r}"]


def _messages(exc: BaseException) -> str:
    """The first line of each error in the chain:
    draccus wraps the class's own ValueError in a ParsingError."""
    parts = []
    while exc is not None and len(parts) < 5:
        parts.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)


def lerobot_check(work: Path) -> bool:
    import logging

    import draccus
    import lerobot.policies  # noqa: F401 - registers LeRobot's policy config classes with the parser
    from lerobot.configs.policies import PreTrainedConfig

    logging.disable(logging.WARNING)  # "Device 'None' is not available. Switching to 'cpu'." per config
    manifest = json.loads((work / "manifest.json").read_text())
    passed, failed, auto = 0, [], 0
    for case in manifest:
        directory = work / case["dir"]
        expect = case["expect_refusal"]
        try:
            parsed = PreTrainedConfig.from_pretrained(str(directory))
        except Exception as exc:  # noqa: BLE001 - any refusal is reported with its message
            message = _messages(exc)
            if expect and expect in message:
                passed += 1
            else:
                failed.append(f"{case['dir']} {case['setting']}: LeRobot refused it ({message[:300]})")
            continue
        if expect:
            failed.append(
                f"{case['dir']} {case['setting']}: LeRobot parsed it, expected a refusal ({expect})"
            )
            continue
        ours = json.loads((directory / "config.json").read_text())
        ours.pop("device", None)
        theirs = json.loads(json.dumps(draccus.encode(parsed, PreTrainedConfig)))
        problems = []
        if getattr(parsed, "_auto_pretrained_path", False):
            # LeRobot's FastWAM points a fresh config's pretrained_path at base_model_id (ours loads the base
            # in initial_weights instead) and writes it back as null: that derivation, nothing else, passes
            auto += 1
            if ours.pop("pretrained_path", None) is not None or str(parsed.pretrained_path) != str(
                parsed.base_model_id
            ):
                problems.append(f"pretrained_path: LeRobot's {parsed.pretrained_path!r}")
        problems += _subset_mismatches(ours, theirs, "config")
        if list(parsed.image_features) != [
            k for k, f in ours.get("input_features", {}).items() if f["type"] == "VISUAL"
        ]:
            problems.append(f"cameras: LeRobot's image_features {list(parsed.image_features)}")
        if problems:
            failed.append(f"{case['dir']} {case['setting']}: {'; '.join(problems)}")
        else:
            passed += 1
        own = directory / "lerobot"
        own.mkdir(exist_ok=True)
        parsed._save_pretrained(own)  # what LeRobot's save_pretrained writes, for ours-read
    for line in failed:
        print(f"[lerobot] FAIL {line}")
    refused = sum(1 for c in manifest if c["expect_refusal"])
    print(
        f"[lerobot] {passed}/{len(manifest)} configs as expected ({len(manifest) - refused} to parse with "
        f"the same values, {refused} to be refused on purpose; {auto} FastWAM configs given LeRobot's "
        f"automatic pretrained_path = base_model_id)"
    )
    return not failed


def lerobot_fields(out: Path, types: list[str]) -> None:
    import dataclasses

    import lerobot
    import lerobot.policies  # registers its config classes (imported for the side effect)
    from lerobot.configs.policies import PreTrainedConfig

    known = PreTrainedConfig.get_known_choices()
    fields = {t: sorted(f.name for f in dataclasses.fields(known[t])) if t in known else None for t in types}
    out.write_text(json.dumps({"lerobot_version": lerobot.__version__, "fields": fields}, indent=1) + "\n")
    print(f"[lerobot-fields] wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode",
        nargs="?",
        default="run",
        choices=["run", "ours-write", "lerobot-check", "ours-read", "lerobot-fields"],
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory, or lerobot-fields' output file")
    parser.add_argument(
        "--policy",
        action="append",
        default=[],
        help="lerobot-fields: a policy type to list (repeated; run passes every registered policy)",
    )
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    args = parser.parse_args()
    if args.mode == "ours-write":
        return 0 if ours_write(args.dir) else 1
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.dir) else 1
    if args.mode == "ours-read":
        return 0 if ours_read(args.dir) else 1
    if args.mode == "lerobot-fields":
        if not args.policy:
            parser.error("lerobot-fields needs --policy for each type (run passes our registry's)")
        lerobot_fields(args.dir, args.policy)
        return 0
    work = args.dir or Path(tempfile.mkdtemp(prefix="config-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    ours_ok = ours_write(work)
    lerobot_ok = (
        subprocess.run([args.lerobot_python, me, "lerobot-check", str(work)], check=False).returncode == 0
    )
    back_ok = ours_read(work)
    fresh = work / "lerobot_config_fields.json"
    types = [arg for policy in registered() for arg in ("--policy", policy)]
    subprocess.run([args.lerobot_python, me, "lerobot-fields", str(fresh), *types], check=True)
    fields_ok = json.loads(fresh.read_text()) == json.loads(PINNED_FIELDS.read_text())
    if not fields_ok:
        print(
            f"[fields] LeRobot's config fields differ from {PINNED_FIELDS.relative_to(REPO)}: "
            f"compare with {fresh}"
        )
    print(
        f"ours read back: {'PASS' if ours_ok else 'FAIL'}; LeRobot parses ours: "
        f"{'PASS' if lerobot_ok else 'FAIL'}; we read LeRobot's: {'PASS' if back_ok else 'FAIL'}; "
        f"pinned LeRobot fields current: {'PASS' if fields_ok else 'FAIL'}"
    )
    return 0 if ours_ok and lerobot_ok and back_ok and fields_ok else 1


if __name__ == "__main__":
    sys.exit(main())

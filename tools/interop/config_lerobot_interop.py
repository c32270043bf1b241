r"""Check that every ``config.json`` we write parses with LeRobot's own parser and means the same to it.

LeRobot's ``PreTrainedConfig.from_pretrained`` (draccus) refuses a ``config.json`` with a key its dataclass
lacks, and runs the class's ``__post_init__`` checks on the values. Our settings LeRobot lacks therefore go to
``config_extensions.json`` (``lerobot_cli.policies.extensions``); this driver checks the result for every
policy and, one field at a time, every setting we accept:

1. ours-write     (our env, torch-free) for each policy and each field, configs with that field at other
                  values than its default (every choice of a choice field) that our validators accept, saved
                  with ``save_policy_config``; each read back with ``load_policy_config`` must equal the
                  config. The cameras are ``observation.wrist_rgb`` and ``observation.top``: no
                  ``observation.images`` prefix, listed wrist first (LeRobot keeps the config's order).
2. lerobot-check  (LeRobot env) ``PreTrainedConfig.from_pretrained`` on each directory: it must parse, and
                  every value we wrote must be the value LeRobot's parsed config holds (nested dicts: every
                  key we wrote; ``device`` aside, which LeRobot's ``__post_init__`` moves to an available
                  device). A tiny pi0/pi05 (``paligemma_variant=gemma_tiny``, which LeRobot cannot build) must
                  be refused with LeRobot's own message (``TINY_REFUSAL``), never parsed into something else,
                  and an ``mlp`` (LeRobot has no such policy) by its type.
3. lerobot-fields (LeRobot env) writes the dataclass fields of LeRobot's config class for each of our policy
                  types (null for a type LeRobot lacks) to FILE; ``run`` compares them with the list the unit
                  tests pin (packages/lerobot-cli/tests/data/lerobot_config_fields.json).

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
POLICIES = ("act", "diffusion", "mlp", "pi0", "pi05")
# LeRobot refuses a tiny pi0/pi05 on purpose: it has no such model (and vision_variant=tiny, which is not in
# config.json, is only accepted with gemma_tiny, so LeRobot never reads a tiny SigLIP as so400m).
TINY_REFUSAL = "Invalid paligemma_variant: gemma_tiny"
# A policy LeRobot has no class for: its config.json keeps every field and LeRobot refuses it by type.
UNKNOWN_TO_LEROBOT = {"mlp": "Policy type 'mlp'"}
CAMERAS = {"observation.wrist_rgb": (3, 96, 96), "observation.top": (3, 96, 96)}
CAMERAS_UNEQUAL = {
    "observation.wrist_rgb": (3, 64, 80),
    "observation.top": (3, 96, 96),
}  # diffusion needs equal


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _features(policy: str) -> dict[str, Any]:
    from lerobot_cli.policies.features import PolicyFeature

    cameras = CAMERAS if policy == "diffusion" else CAMERAS_UNEQUAL
    inputs = {
        "observation.state": PolicyFeature("STATE", (6,)),
        **{k: PolicyFeature("VISUAL", shape) for k, shape in cameras.items()},
    }
    return {"input_features": inputs, "output_features": {"action": PolicyFeature("ACTION", (6,))}}


def _special_cases() -> dict[str, list[dict[str, Any]]]:
    """Fields whose other values are choices, need a companion setting, or are not plain numbers."""
    from lerobot_cli.policies.act.config import FEEDFORWARD_ACTIVATIONS
    from lerobot_cli.policies.act.config import SUPPORTED_BACKBONES as ACT_BACKBONES
    from lerobot_cli.policies.diffusion.config import (
        BETA_SCHEDULES,
        LR_SCHEDULERS,
        NOISE_SCHEDULERS,
        PREDICTION_TYPES,
    )
    from lerobot_cli.policies.features import NormalizationMode
    from lerobot_cli.policies.pi0.config import DTYPES
    from lerobot_cli.policies.pi0.variants import GEMMA_VARIANTS, VISION_VARIANTS

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
    special = _special_cases()
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


def ours_write(work: Path) -> bool:
    from lerobot_cli.policies import registry
    from lerobot_cli.policies.serialization import load_policy_config, save_policy_config

    manifest, ok = [], True
    for policy in POLICIES:
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
            expect = TINY_REFUSAL if overrides.get("paligemma_variant") == "gemma_tiny" else None
            manifest.append(
                {
                    "dir": directory.name,
                    "policy": policy,
                    "field": name,
                    "setting": json.loads(json.dumps(overrides, default=list)),
                    "expect_refusal": UNKNOWN_TO_LEROBOT.get(policy) or expect,
                }
            )
        print(
            f"[ours] {policy}: {len(cases)} configs written; fields with no other accepted value: "
            f"{', '.join(uncovered) or 'none'}"
        )
    (work / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return ok


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
    passed, failed = 0, []
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
        problems = _subset_mismatches(ours, theirs, "config")
        if list(parsed.image_features) != [
            k for k, f in ours.get("input_features", {}).items() if f["type"] == "VISUAL"
        ]:
            problems.append(f"cameras: LeRobot's image_features {list(parsed.image_features)}")
        if problems:
            failed.append(f"{case['dir']} {case['setting']}: {'; '.join(problems)}")
        else:
            passed += 1
    for line in failed:
        print(f"[lerobot] FAIL {line}")
    refused = sum(1 for c in manifest if c["expect_refusal"])
    print(
        f"[lerobot] {passed}/{len(manifest)} configs as expected ({len(manifest) - refused} to parse with "
        f"the same values, {refused} to be refused on purpose)"
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
        "mode", nargs="?", default="run", choices=["run", "ours-write", "lerobot-check", "lerobot-fields"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory, or lerobot-fields' output file")
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
    if args.mode == "lerobot-fields":
        lerobot_fields(args.dir, list(POLICIES))
        return 0
    work = args.dir or Path(tempfile.mkdtemp(prefix="config-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    ours_ok = ours_write(work)
    lerobot_ok = (
        subprocess.run([args.lerobot_python, me, "lerobot-check", str(work)], check=False).returncode == 0
    )
    fresh = work / "lerobot_config_fields.json"
    subprocess.run([args.lerobot_python, me, "lerobot-fields", str(fresh)], check=True)
    fields_ok = json.loads(fresh.read_text()) == json.loads(PINNED_FIELDS.read_text())
    if not fields_ok:
        print(
            f"[fields] LeRobot's config fields differ from {PINNED_FIELDS.relative_to(REPO)}: "
            f"compare with {fresh}"
        )
    print(
        f"ours read back: {'PASS' if ours_ok else 'FAIL'}; LeRobot parses ours: "
        f"{'PASS' if lerobot_ok else 'FAIL'}; pinned LeRobot fields current: "
        f"{'PASS' if fields_ok else 'FAIL'}"
    )
    return 0 if ours_ok and lerobot_ok and fields_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Check that our SmolVLA and LeRobot 0.6.1's compute the same thing on the same weights and batch.

LeRobot needs its own environment, so, like pi0_lerobot_interop.py, this script runs in two interpreters and
hands files between them:

    uv run python tools/interop/smolvla_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Both sides build the policy on one tiny SmolVLM (packages/lerobot-cli/tests/smolvlm_tiny.py's config.json,
written into the work directory and named by ``vlm_model_name``). Per case of ``CASES``:

1. ours-write     (our env)     a seeded tiny policy (constant norms perturbed) saved as model.safetensors;
                                the batch (cameras 48x64 or 72x40, resized with padding to 32x32 both sides,
                                token rows of other lengths, state 6, action 6, chunk 4, some steps past the
                                episode end in ``action_is_pad``); and, as reference: the loss with
                                ``torch.manual_seed(SEED)`` drawing the noise and the time inside ``forward``
                                (LeRobot's order: noise, then time), the gradient of every trainable
                                parameter, and ``select_action``'s first action (its chunk's noise drawn after
                                ``torch.manual_seed(SEED + 1)``) and the whole chunk.
2. lerobot-check  (LeRobot env) LeRobot's ``SmolVLAPolicy`` of the same config loads that file with
                                ``load_state_dict(strict=True)``: same keys, shapes and dtypes; recomputes the
                                reference the same way, compares, and reports the max |Δ| of each. Then a
                                seeded LeRobot policy is written with its own ``save_pretrained``, with its
                                outputs.
3. ours-check     (our env)     that directory through our ``load_policy`` (LeRobot's config.json parsed by
                                ours, the weights loaded strictly): the same outputs, compared the same way.

The ``vlm-weights-*`` cases build with ``load_vlm_weights=True`` on both sides, from one tiny SmolVLM whose
seeded fp32 weights are two shards and an index (``smolvlm_tiny.save_tiny_smolvlm_weights``), cut to 2 of
its 4 text layers: LeRobot's ``from_pretrained(torch_dtype=bfloat16)`` against ours. Before step 1's
perturbation our policy as built is saved, and LeRobot's, built from the same seed, must equal it in names,
shapes, dtypes and, bit for bit, every VLM tensor (the file's, in bf16) and every fp32 one; the bf16
expert's random draws are counted apart (``compare_built`` says why). Step 3 loads LeRobot's saved
directory (config.json with ``load_vlm_weights: true``) with the VLM's weight files moved away: they are
not read (the checkpoint holds every tensor), only the dtypes they imply are built.

Once per run: the full-size SmolVLA (packages/lerobot-cli/tests/data/smolvlm2_500m_video_instruct_config.json,
defaults otherwise) on the meta device on both sides: key count, value count, trainable count, and each key's
shape and dtype.

LeRobot's model loads ``AutoProcessor.from_pretrained(vlm_model_name)`` only to read two image-token ids it
uses with ``add_image_special_tokens`` (off here, refused by ours); the LeRobot process replaces that call
with a stub holding those ids (its module is patched in memory, never its files), so the tiny directory needs
no image processor. Everything runs on the CPU in fp32. Tolerances: the forward (loss, actions) must be
bit-equal (``FORWARD_ATOL`` = 0: the same operations in the same order); gradients within ``GRAD_RTOL`` of
each parameter's largest gradient (autograd may accumulate a reused tensor's contributions in another
order). Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _interop_common import load_inputs, perturb_constants
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "packages" / "lerobot-cli" / "tests"
FULL_CONFIG = TESTS / "data" / "smolvlm2_500m_video_instruct_config.json"
FORWARD_ATOL = 0.0
GRAD_RTOL = 1e-5
SEED = 1234
BATCH, CHUNK, STATE_DIM, ACTION_DIM, TOKENS = 3, 4, 6, 6, 8
TINY = {
    "chunk_size": CHUNK,
    "n_action_steps": CHUNK,
    "num_vlm_layers": 4,
    "resize_imgs_with_padding": (32, 32),
    "tokenizer_max_length": TOKENS,
}
ONE_CAMERA = {"observation.images.top": (3, 48, 64)}
TWO_CAMERAS = {"observation.wrist_rgb": (3, 48, 64), "observation.images.side": (3, 72, 40)}
# name -> (cameras in the config, cameras the batch lacks, config overrides)
CASES = {
    "cross-defaults": (ONE_CAMERA, (), {}),
    "cross-train-vlm-2cam+empty": (
        TWO_CAMERAS,
        (),
        {"train_expert_only": False, "freeze_vision_encoder": False, "empty_cameras": 1},
    ),
    "cross-half-expert-missing-cam": (
        TWO_CAMERAS,
        ("observation.images.side",),
        {
            "num_expert_layers": 2,
            "self_attn_every_n_layers": 4,
            "empty_cameras": 1,
            "train_expert_only": False,
            "train_state_proj": False,
        },
    ),
    "self-attn-prefix-length": (
        ONE_CAMERA,
        (),
        {"attention_mode": "self_attn", "prefix_length": 20, "self_attn_every_n_layers": 3},
    ),
    # SmolVLM2's config.json gives its text model torch_dtype bfloat16: the text model and the expert are
    # built in bf16 (the replaced cross-attention k/v and the rest fp32), on both sides
    "bf16-text-defaults": (ONE_CAMERA, (), {}),
    "bf16-text-train-vlm": (ONE_CAMERA, (), {"train_expert_only": False, "freeze_vision_encoder": False}),
    # load_vlm_weights: both sides read the VLM from the tiny SmolVLM's seeded fp32 weights (two shards and
    # an index), in bf16, cut to 2 of its 4 text layers; the expert bf16 but its cross k/v fp32
    "vlm-weights-defaults": (ONE_CAMERA, (), {"load_vlm_weights": True, "num_vlm_layers": 2}),
    "vlm-weights-train-vlm": (
        ONE_CAMERA,
        (),
        {
            "load_vlm_weights": True,
            "num_vlm_layers": 2,
            "train_expert_only": False,
            "freeze_vision_encoder": False,
        },
    ),
}
BF16_TEXT = "bf16-text"  # cases whose name starts with it read the tiny SmolVLM with a bf16 text config
VLM_WEIGHTS = "vlm-weights"  # cases whose name starts with it read the tiny SmolVLM's weights


def tiny_vlm_of(work: Path, case: str) -> Path:
    if case.startswith(VLM_WEIGHTS):
        return work / "tiny-smolvlm-weights"
    return work / ("tiny-smolvlm-bf16-text" if case.startswith(BF16_TEXT) else "tiny-smolvlm")


def _features(cameras: dict, policy_feature, feature_type) -> dict:
    return {
        "input_features": {
            **{k: policy_feature(feature_type.VISUAL, shape) for k, shape in cameras.items()},
            "observation.state": policy_feature(feature_type.STATE, (STATE_DIM,)),
        },
        "output_features": {"action": policy_feature(feature_type.ACTION, (ACTION_DIM,))},
    }


def make_inputs(cameras: dict, missing: tuple, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([TOKENS, 5, 1])
    inputs = {k: torch.rand(BATCH, *shape, generator=g) for k, shape in cameras.items() if k not in missing}
    inputs.update(
        {
            "observation.state": torch.randn(BATCH, STATE_DIM, generator=g),
            "action": torch.randn(BATCH, CHUNK, ACTION_DIM, generator=g),
            "action_is_pad": torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]], dtype=torch.bool),
            "observation.language.tokens": torch.randint(0, 260, (BATCH, TOKENS), generator=g),
            "observation.language.attention_mask": torch.arange(TOKENS)[None] < lengths[:, None],
        }
    )
    return inputs


def outputs(policy, inputs: dict[str, torch.Tensor], forward) -> dict[str, torch.Tensor]:
    """Loss (seeded draws), gradients of the trainable parameters, select_action and the chunk."""
    policy.train()
    policy.zero_grad(set_to_none=True)
    torch.manual_seed(SEED)
    loss = forward(dict(inputs))
    loss.backward()
    out = {"loss": loss.detach().clone()}
    for name, param in policy.named_parameters():
        if param.requires_grad:
            out[f"grad/{name}"] = param.grad.detach().clone() if param.grad is not None else torch.zeros(0)
    policy.reset()
    torch.manual_seed(SEED + 1)
    out["select_action"] = policy.select_action(dict(inputs)).clone()
    policy.reset()
    torch.manual_seed(SEED + 1)
    out["chunk"] = policy.predict_action_chunk(dict(inputs)).clone()
    return out


# ---------------------------------------------------------------- our side


def _our_config(vlm: Path, cameras: dict, overrides: dict, **extra):
    from lerobot_cli.features import FeatureType, PolicyFeature
    from lerobot_cli.policies.smolvla.config import SmolVLAConfig

    return SmolVLAConfig(
        **_features(cameras, PolicyFeature, FeatureType),
        vlm_model_name=str(vlm),
        **{**TINY, **extra, **overrides},
    )


def key_shapes(state_dict) -> dict[str, list]:
    return {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state_dict.items()}


def counts(policy) -> dict[str, int]:
    return {
        "keys": len(policy.state_dict()),
        "values": sum(v.numel() for v in policy.state_dict().values()),
        "params": sum(p.numel() for p in policy.parameters()),
        "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
    }


def write_full_vlm(work: Path) -> Path:
    full = work / "smolvlm2-500m"
    full.mkdir(parents=True, exist_ok=True)
    config = json.loads(FULL_CONFIG.read_text())
    config.pop("_source")
    (full / "config.json").write_text(json.dumps(config))
    return full


def ours_write(work: Path) -> None:
    sys.path.insert(0, str(TESTS))
    from lerobot_cli.policies.smolvla.modeling import SmolVLAPolicy
    from lerobot_cli.policies.weights import build_policy
    from smolvlm_tiny import save_tiny_smolvlm, save_tiny_smolvlm_weights

    save_tiny_smolvlm(work / "tiny-smolvlm")
    save_tiny_smolvlm(work / "tiny-smolvlm-bf16-text", text_dtype="bfloat16")
    save_tiny_smolvlm_weights(save_tiny_smolvlm(work / "tiny-smolvlm-weights"), seed=7, shards=2)
    for i, (name, (cameras, missing, overrides)) in enumerate(CASES.items()):
        case = work / name
        case.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(i)
        # build_policy: the fresh policy with what it starts from (load_vlm_weights: the VLM's weights)
        policy = build_policy(_our_config(tiny_vlm_of(work, name), cameras, overrides))
        if name.startswith(VLM_WEIGHTS):  # as built, before any perturbation: LeRobot's must equal it
            save_file(
                {k: v.contiguous() for k, v in policy.state_dict().items()}, str(case / "built.safetensors")
            )
        perturb_constants(policy, seed=100 + i)
        save_file(
            {k: v.contiguous() for k, v in policy.state_dict().items()}, str(case / "model.safetensors")
        )
        inputs = make_inputs(cameras, missing, seed=10 + i)
        save_file(inputs, str(case / "inputs.safetensors"))
        ref = outputs(policy, load_inputs(case / "inputs.safetensors"), lambda b, p=policy: p(b)[0])
        save_file(ref, str(case / "reference.safetensors"))
        (case / "keys.json").write_text(json.dumps(key_shapes(policy.state_dict())))
    full = write_full_vlm(work)
    with torch.device("meta"):
        policy = SmolVLAPolicy(_our_config(full, ONE_CAMERA, {}, **FULL_DEFAULTS))
    (work / "full.json").write_text(
        json.dumps({"counts": counts(policy), "keys": key_shapes(policy.state_dict())})
    )


FULL_DEFAULTS = {
    "chunk_size": 50,
    "n_action_steps": 50,
    "num_vlm_layers": 16,
    "resize_imgs_with_padding": (512, 512),
    "tokenizer_max_length": 48,
}


# ---------------------------------------------------------------- LeRobot's side


def _patch_lerobot(module) -> None:
    """LeRobot reads two image-token ids from the VLM's processor (add_image_special_tokens uses them)."""

    class _Tokenizer:
        fake_image_token_id = 0
        global_image_token_id = 1

    class _Processor:
        tokenizer = _Tokenizer()

    module.AutoProcessor.from_pretrained = staticmethod(lambda *args, **kwargs: _Processor())


def _lerobot_policy(vlm: Path, cameras: dict, overrides: dict, **extra):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.smolvla import smolvlm_with_expert
    from lerobot.policies.smolvla.configuration_smolvla import SmolVLAConfig
    from lerobot.policies.smolvla.modeling_smolvla import SmolVLAPolicy

    _patch_lerobot(smolvlm_with_expert)
    config = SmolVLAConfig(
        **_features(cameras, PolicyFeature, FeatureType),
        vlm_model_name=str(vlm),
        device="cpu",
        **{**TINY, **extra, **overrides},
    )
    return SmolVLAPolicy(config)


def compare(tag: str, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> tuple[bool, dict]:
    ok, figures = True, {}
    if set(ref) != set(got):
        print(
            f"[{tag}] outputs differ: only ours {sorted(set(ref) - set(got))[:5]}, only LeRobot's "
            f"{sorted(set(got) - set(ref))[:5]}"
        )
        ok = False
    grad_rel = 0.0
    for key in sorted(set(ref) & set(got)):
        a, b = ref[key], got[key]
        if a.shape != b.shape or a.dtype != b.dtype:
            print(f"[{tag}] {key}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
            ok = False
            continue
        diff = (a.double() - b.double()).abs().max().item() if a.numel() else 0.0
        if key.startswith("grad/"):
            scale = a.double().abs().max().item() if a.numel() else 0.0
            rel = diff / scale if scale else diff
            grad_rel = max(grad_rel, rel)
            figures["grad max |Δ|"] = max(figures.get("grad max |Δ|", 0.0), diff)
            if rel > GRAD_RTOL:
                print(f"[{tag}] {key}: gradient max |Δ| {diff:.3e} ({rel:.2e} of its largest)")
                ok = False
        else:
            figures[key] = diff
            if diff > FORWARD_ATOL:
                print(f"[{tag}] {key}: max |Δ| {diff:.3e}")
                ok = False
    figures["grad max relative"] = grad_rel
    return ok, figures


def compare_built(name: str, ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> dict:
    """Both sides' state dicts as built from one seed with load_vlm_weights: names, shapes, dtypes and the
    VLM's values (the file's, in bf16) bit for bit, and every fp32 tensor (the projections, the cross
    k/v: same draws in the same order). The bf16 expert's own random draws are compared and counted
    apart: transformers 5.5 (LeRobot's env) and ours initialise a bf16 tensor from the same RNG state
    differently (load_vlm_weights=false with a bf16 text config shows it too); its values are not
    LeRobot's to choose and come from the file in a loss comparison."""
    layout = key_shapes(ours) == key_shapes(theirs)
    if not layout:
        print(f"[{name}] built state dicts differ in names/shapes/dtypes")
    vlm = [k for k in ours if ".vlm." in k]
    other_fp32 = [k for k in ours if ".vlm." not in k and ours[k].dtype == torch.float32]
    expert_bf16 = [k for k in ours if ".vlm." not in k and ours[k].dtype == torch.bfloat16]
    bad = [k for k in vlm + other_fp32 if k in theirs and not torch.equal(ours[k], theirs[k])]
    fp32 = other_fp32
    if bad:
        print(f"[{name}] built tensors differ: {bad[:5]}")
    draws = sum(not torch.equal(ours[k], theirs[k]) for k in expert_bf16 if k in theirs)
    return {
        "ok": layout and not bad,
        "built VLM tensors equal": f"{len(vlm) - sum(k in bad for k in vlm)}/{len(vlm)}",
        "built fp32 tensors equal": f"{len(other_fp32) - sum(k in bad for k in fp32)}/{len(other_fp32)}",
        "built bf16 expert draws differing": f"{draws}/{len(expert_bf16)}",
    }


def lerobot_check(work: Path) -> bool:
    ok, report = True, {}
    for i, (name, (cameras, _missing, overrides)) in enumerate(CASES.items()):
        case = work / name
        torch.manual_seed(i)  # ours_write's seed: a load_vlm_weights policy as built is compared whole
        policy = _lerobot_policy(tiny_vlm_of(work, name), cameras, overrides)
        built, built_ok = {}, True
        if name.startswith(VLM_WEIGHTS):
            built = compare_built(name, load_file(str(case / "built.safetensors")), policy.state_dict())
            built_ok = built.pop("ok")
        theirs = key_shapes(policy.state_dict())
        ours = json.loads((case / "keys.json").read_text())
        if theirs != ours:
            only_ours, only_theirs = sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours))
            shapes = [k for k in set(ours) & set(theirs) if ours[k] != theirs[k]]
            print(
                f"[{name}] keys differ: only ours {only_ours[:5]}, only LeRobot {only_theirs[:5]}, "
                f"shape/dtype {shapes[:5]}"
            )
            ok = False
        policy.load_state_dict(load_file(str(case / "model.safetensors")), strict=True)

        def forward(batch, p=policy):
            return p.forward(batch)[0]

        got = outputs(policy, load_inputs(case / "inputs.safetensors"), forward)
        case_ok, figures = compare(name, load_file(str(case / "reference.safetensors")), got)
        case_ok &= built_ok
        ok &= case_ok
        report[name] = {"ok": case_ok, "keys": len(theirs), **built, **figures}
        # the other way: a seeded LeRobot policy, saved by LeRobot, with its outputs as the reference
        torch.manual_seed(50 + len(report))
        policy = _lerobot_policy(tiny_vlm_of(work, name), cameras, overrides)
        perturb_constants(policy, seed=200 + len(report))
        policy.save_pretrained(str(case / "lerobot"))
        got = outputs(policy, load_inputs(case / "inputs.safetensors"), lambda b, p=policy: p.forward(b)[0])
        save_file(got, str(case / "lerobot" / "reference.safetensors"))
    full = write_full_vlm(work)
    with torch.device("meta"):
        policy = _lerobot_policy(full, ONE_CAMERA, {}, **FULL_DEFAULTS)
    ours = json.loads((work / "full.json").read_text())
    theirs = {"counts": counts(policy), "keys": key_shapes(policy.state_dict())}
    full_ok = theirs == ours
    if not full_ok:
        print(
            f"[full-size] counts ours {ours['counts']} vs LeRobot {theirs['counts']}; differing keys "
            f"{sorted(set(ours['keys']) ^ set(theirs['keys']))[:5]}"
        )
    ok &= full_ok
    report["full-size (meta)"] = {"ok": full_ok, **theirs["counts"]}
    (work / "lerobot_report.json").write_text(json.dumps(report, indent=2))
    for name, figures in report.items():
        print(
            f"{name}: {'PASS' if figures['ok'] else 'FAIL'} "
            + ", ".join(
                f"{k}={v:.3e}" if isinstance(v, float) else f"{k}={v}"
                for k, v in figures.items()
                if k != "ok"
            )
        )
    return ok


def ours_check(work: Path) -> bool:
    """LeRobot's saved directories through our loader (its config.json parsed by ours, strict weights)."""
    from lerobot_cli.policies.weights import load_policy

    ok = True
    # LeRobot's config.json says load_vlm_weights=true, but its model.safetensors holds every tensor: the
    # VLM's weights are moved away first, so a load that still reads them fails
    hidden = work / "hidden-vlm-weights"
    hidden.mkdir(exist_ok=True)
    for file in (work / "tiny-smolvlm-weights").glob("model*.safetensors*"):
        file.rename(hidden / file.name)
    for name in CASES:
        directory = work / name / "lerobot"
        _, policy = load_policy(directory)
        got = outputs(policy, load_inputs(work / name / "inputs.safetensors"), lambda b, p=policy: p(b)[0])
        case_ok, figures = compare(
            f"ours<-lerobot {name}", load_file(str(directory / "reference.safetensors")), got
        )
        ok &= case_ok
        print(
            f"ours<-lerobot {name}: {'PASS' if case_ok else 'FAIL'} "
            + ", ".join(f"{k}={v:.3e}" for k, v in figures.items())
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "lerobot-check", "ours-check"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot 0.6.1 (with transformers) is installed",
    )
    args = parser.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    if args.mode == "ours-write":
        ours_write(args.dir)
        return 0
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.dir) else 1
    if args.mode == "ours-check":
        return 0 if ours_check(args.dir) else 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="smolvla-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ours_write(work)
        lerobot = subprocess.run(
            [args.lerobot_python, str(Path(__file__).resolve()), "lerobot-check", str(work)], check=False
        )
        saved = all((work / name / "lerobot" / "reference.safetensors").is_file() for name in CASES)
        ours_ok = saved and ours_check(work)
    passed = lerobot.returncode == 0 and ours_ok
    print(
        f"LeRobot computes ours: {'PASS' if lerobot.returncode == 0 else 'FAIL'}; we compute LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'} ({time.perf_counter() - start:.0f} s)"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

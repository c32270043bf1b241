"""Our FastWAM networks against LeRobot 0.6.1's: full-size state dicts, and the MoT passes of a tiny model.

LeRobot needs its own environment (Python 3.12, lerobot 0.6.1 with diffusers), so this script runs in two
interpreters and hands files between them:

    uv run python tools/interop/fastwam_lerobot_interop.py --lerobot-python <LeRobot env python>

1. ours-write     (our env)      Full size on the meta device, with and without ``freeze_video_expert``:
                                 every key's shape and dtype, the parameter and trainable counts, and what
                                 ``get_optim_params`` returns. Per tiny case: our ``config.json`` (and
                                 sidecar), a seeded policy saved as ``model.safetensors``, the inputs, and our
                                 outputs as reference.
2. lerobot-check  (LeRobot env)  The same full-size figures from LeRobot's ``FastWAMPolicy`` (its DiTs built
                                 on the meta device; the frozen VAE/UMT5 loaders stubbed: they hold no policy
                                 weights and would need the network). Per case: LeRobot parses our
                                 ``config.json`` to our values, its policy loads our file with
                                 ``load_state_dict(strict=True)`` (each key in the dtype its model holds) and
                                 recomputes our reference; then a policy seeded on its side is written by its
                                 own ``save_pretrained``, with its outputs.
3. ours-check     (our env)      That directory: its ``config.json`` read by our serializer has LeRobot's
                                 values, its weights load into ours strictly (and again in LeRobot's legacy
                                 ``mixtures.<expert>.blocks.<i>`` layout), our outputs equal LeRobot's.

Outputs compared per case (fp32, CPU):

* ``joint``: the video and action velocities of one joint MoT pass (LeRobot's ``FastWAM._run_training_mot``:
  both experts' embeddings, the mixture mask, 2 layers, both heads) on noisy latents, noisy actions,
  per-sample timesteps and a text context with the proprio token appended (``_append_proprio_to_context``);
* ``grad.*``: the gradient of every parameter of a fixed weighted sum of both velocities;
* ``cached``: the action velocity from the first-frame video prefill and the cached action pass (LeRobot's
  ``infer_action`` internals: ``pre_dit`` at timestep 0, ``prefill_video_cache``,
  ``_predict_action_noise_with_cache``), for ``first_frame_causal`` cases.

Tolerance: 0 (``torch.equal``) for every output and gradient. Both sides run the same operations in the same
order and dtypes (Wan's float64 rotary products, fp32 norms, the same SDPA calls on the same shapes), so any
difference is a bug, not rounding. Inputs read back from safetensors are cloned first (``load_inputs``): CPU
kernels split a tensor into vector lanes by its address, and an mmap'd tensor's address differs from a fresh
allocation's, which alone moved outputs by 1e-7. Cases: ``default`` (LeRobot's defaults at tiny sizes:
first_frame_causal, fp32 attention, proprio 8) and ``conditioned`` (an action-conditioned video DiT with
group_diagonal action groups, per_frame_causal video masks, attention in the inputs' dtype, no proprio).
bf16 is not compared here; fastwam_policy_lerobot_interop.py compares the whole policy in bf16 too, with
CUDA's autocast emulated on LeRobot's side (``_cuda_autocast_on_cpu.py``: its fp32 regions are CUDA autocast
contexts, inert on a CPU). Exit status 0: everything passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from _interop_common import compare_exact, load_inputs, perturb_constants
from safetensors.torch import load_file, save_file

BATCH, HORIZON, ACTION_DIM, PROPRIO, TEXT_LEN, TEXT_DIM, LATENT = 2, 8, 7, 8, 5, 32, 48
LATENT_SHAPE = (BATCH, LATENT, 3, 4, 6)  # 3 latent frames of 2 × 3 patches
CASES = {
    "default": {"proprio_dim": PROPRIO, "video": {}, "fp32_attention": True},
    "conditioned": {
        "proprio_dim": None,
        "fp32_attention": False,
        "video": {
            "action_conditioned": True,
            "action_group_causal_mask_mode": "group_diagonal",
            "video_attention_mask_mode": "per_frame_causal",
        },
    },
}
FULL_SIZE_FILE = {"ours": "ours_full.json", "lerobot": "lerobot_full.json"}


# ---------------------------------------------------------------- shared (both interpreters)


def make_inputs(seed: int, proprio: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(BATCH, TEXT_LEN, dtype=torch.bool)
    mask[1, -2:] = False  # a padded prompt in the second sample
    inputs = {
        "latents": torch.randn(LATENT_SHAPE, generator=g),
        "timestep_video": torch.tensor([500.5, 812.25]),
        "noisy_action": torch.randn(BATCH, HORIZON, ACTION_DIM, generator=g),
        "action": torch.randn(BATCH, HORIZON, ACTION_DIM, generator=g),
        "timestep_action": torch.tensor([123.0, 999.0]),
        "context": torch.randn(BATCH, TEXT_LEN, TEXT_DIM, generator=g),
        "context_mask": mask,
        "weight_video": torch.randn(LATENT_SHAPE, generator=g),
        "weight_action": torch.randn(BATCH, HORIZON, ACTION_DIM, generator=g),
    }
    if proprio:
        inputs["proprio"] = torch.randn(BATCH, PROPRIO, generator=g)
    return inputs


def loss_of(
    pred_video: torch.Tensor, pred_action: torch.Tensor, inputs: dict[str, torch.Tensor]
) -> torch.Tensor:
    return (pred_video * inputs["weight_video"]).sum() + (pred_action * inputs["weight_action"]).sum()


def gradients(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {
        f"grad.{name}": p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None
    }


def compare(tag: str, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> tuple[bool, dict]:
    """Exact equality of every reference tensor; figures are max |Δ| per output and over all gradients."""
    return compare_exact(tag, ref, got, {"grad.": "gradients"}, print_mismatches=False)


# ---------------------------------------------------------------- our side


def _ours_config(case: str):
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.dit_configs import tiny_dit_configs

    spec = CASES[case]
    video, action = tiny_dit_configs(ACTION_DIM, latent_channels=LATENT, text_dim=TEXT_DIM)
    video.update(spec["video"])
    return FastWAMConfig(
        action_dim=ACTION_DIM,
        proprio_dim=spec["proprio_dim"],
        action_horizon=HORIZON,
        n_action_steps=HORIZON,
        torch_dtype="float32",
        load_text_encoder=False,
        variant="tiny",  # the policy builds a tiny VAE beside the networks (no UMT5), not the real one
        fp32_attention=spec["fp32_attention"],
        video_dit_config=video,
        action_dit_config=action,
    )


def ours_outputs(policy, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = policy.model
    conditioned = model.video_expert.action_conditioned
    policy.train()
    policy.zero_grad(set_to_none=True)
    context, mask = model.append_proprio(inputs["context"], inputs["context_mask"], inputs.get("proprio"))
    pred_video, pred_action = model.predict(
        inputs["latents"],
        inputs["timestep_video"],
        inputs["noisy_action"],
        inputs["timestep_action"],
        context,
        mask,
        video_actions=inputs["action"] if conditioned else None,
    )
    loss_of(pred_video, pred_action, inputs).backward()
    out = {"joint.video": pred_video.detach(), "joint.action": pred_action.detach(), **gradients(policy)}
    policy.zero_grad(set_to_none=True)
    if model.video_expert.attention_mask_mode == "first_frame_causal":
        policy.eval()
        with torch.no_grad():
            cache = model.prefill(inputs["latents"][:, :, :1], context, mask, HORIZON)
            out["cached.action"] = model.predict_action(
                cache, inputs["noisy_action"], inputs["timestep_action"], context, mask
            )
    return out


def full_size_ours() -> dict:
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy

    figures = {}
    for freeze in (False, True):
        with torch.device("meta"):
            policy = FastWAMPolicy(FastWAMConfig(freeze_video_expert=freeze, base_model_id=None))
        figures[f"freeze={freeze}"] = _full_size_figures(policy)
    return figures


def _full_size_figures(policy) -> dict:
    return {
        "keys": {k: [list(v.shape), str(v.dtype)] for k, v in policy.state_dict().items()},
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trainable": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "optim_tensors": len(policy.get_optim_params()),
        "optim_values": sum(p.numel() for p in policy.get_optim_params()),
    }


def ours_write(work: Path) -> None:
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.policies.serialization import save_policy_config
    from lerobot_cli.policies.weights import save_state_dict

    (work / FULL_SIZE_FILE["ours"]).write_text(json.dumps(full_size_ours()))
    for index, case in enumerate(CASES):
        directory = work / case / "ours"
        config = _ours_config(case)
        save_policy_config(config, directory)
        torch.manual_seed(100 + index)
        policy = FastWAMPolicy(config)
        perturb_constants(policy, 200 + index)
        save_state_dict(policy.state_dict(), directory / "model.safetensors")
        inputs = make_inputs(300 + index, config.proprio_dim is not None)
        save_file(inputs, str(work / case / "inputs.safetensors"))
        save_file(
            {k: v.contiguous() for k, v in ours_outputs(policy, inputs).items()},
            str(directory / "reference.safetensors"),
        )


def _legacy_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LeRobot's block names from before the MoTLayer refactor: ``mot.mixtures.<expert>.blocks.<i>.*``."""
    import re

    pattern = re.compile(r"^(model\.mot\.)layers\.(\d+)\.blocks\.([^.]+)\.(.+)$")
    return {pattern.sub(r"\1mixtures.\3.blocks.\2.\4", key): value for key, value in state.items()}


def ours_check(work: Path) -> tuple[bool, dict]:
    import attrs
    from lerobot_cli.policies.fastwam.config import FastWAMConfig
    from lerobot_cli.policies.fastwam.modeling import FastWAMPolicy
    from lerobot_cli.policies.serialization import policy_config_from_dict, policy_config_to_dict
    from lerobot_cli.policies.weights import load_weights

    ok, figures = True, {}
    ours_full = json.loads((work / FULL_SIZE_FILE["ours"]).read_text())
    lerobot_full = json.loads((work / FULL_SIZE_FILE["lerobot"]).read_text())
    for setting, theirs in lerobot_full.items():
        mine = ours_full[setting]
        same = mine == theirs
        if not same:
            differ = (
                sorted(set(mine["keys"]) ^ set(theirs["keys"]))[:5]
                or [k for k in mine["keys"] if mine["keys"][k] != theirs["keys"].get(k)][:5]
            )
            print(
                f"[ours] full size {setting}: ours {[(k, mine[k]) for k in mine if k != 'keys']} vs "
                f"LeRobot {[(k, theirs[k]) for k in theirs if k != 'keys']}; keys differing: {differ}"
            )
        ok &= same
        counts = {k: theirs[k] for k in theirs if k != "keys"}
        figures[f"full {setting}"] = counts | {"keys": len(theirs["keys"])}
    for case in CASES:
        directory = work / case / "lerobot"
        written = json.loads((directory / "config.json").read_text())
        config = policy_config_from_dict(written, FastWAMConfig)
        ours_view = policy_config_to_dict(config)
        mismatched = sorted(
            k for k in written if k != "device" and json.loads(json.dumps(ours_view[k])) != written[k]
        )
        if mismatched:
            print(f"[ours] {case}: LeRobot's config.json reads back differently in {mismatched}")
            ok = False
        inputs = load_inputs(work / case / "inputs.safetensors")
        reference = load_file(str(directory / "reference.safetensors"))
        for layout in ("current", "legacy"):
            policy = FastWAMPolicy(attrs.evolve(config, variant="tiny"))  # a tiny VAE, not the real one
            state = load_file(str(directory / "model.safetensors"))
            if layout == "legacy":
                legacy = directory / "legacy.safetensors"
                save_file(_legacy_layout(state), str(legacy))
                load_weights(policy, legacy, strict=True)
            else:
                load_weights(policy, directory / "model.safetensors", strict=True)
            dtypes = [k for k, v in policy.state_dict().items() if v.dtype != state[k].dtype]
            if dtypes:
                print(f"[ours] {case}: keys whose dtype differs from LeRobot's file: {dtypes[:5]}")
                ok = False
            passed, numbers = compare(f"ours {case} {layout}", reference, ours_outputs(policy, inputs))
            ok &= passed
            figures[f"{case} ({layout} layout)"] = numbers
    return ok, figures


# ---------------------------------------------------------------- LeRobot's side


def _lerobot_patched():
    """LeRobot's FastWAM modules with the frozen-encoder loaders stubbed (no network; they hold no policy
    weights), and DiTs built on the meta device when the config's device is ``meta``."""
    from lerobot.policies.fastwam import modeling_fastwam as modeling

    class NoVAE(torch.nn.Module):
        """Stands in for the frozen Wan VAE, which the MoT passes never call."""

    modeling.load_pretrained_wan_vae = lambda **_: NoVAE()
    modeling.load_pretrained_wan_text_encoder = lambda **_: None
    modeling.build_wan_tokenizer = lambda **_: None
    for name in ("WanVideoDiT", "ActionDiT"):
        real = getattr(modeling, name)

        def build(*args, _real=real, **kwargs):
            if torch.get_default_device().type == "meta" or META_BUILD[0]:
                with torch.device("meta"):
                    return _real(*args, **kwargs)
            return _real(*args, **kwargs)

        setattr(modeling, name, build)
    return modeling


META_BUILD = [False]


def lerobot_outputs(policy, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model = policy.model
    policy.train()
    policy.zero_grad(set_to_none=True)
    context, mask = model._append_proprio_to_context(
        inputs["context"], inputs["context_mask"], inputs.get("proprio")
    )
    pred_video, pred_action = model._run_training_mot(
        inputs={
            "context": context,
            "context_mask": mask,
            "action": inputs["action"],
            "fuse_vae_embedding_in_latents": True,
        },
        targets={
            "latents": inputs["latents"],
            "timestep_video": inputs["timestep_video"],
            "noisy_action": inputs["noisy_action"],
            "timestep_action": inputs["timestep_action"],
        },
    )
    loss_of(pred_video, pred_action, inputs).backward()
    out = {"joint.video": pred_video.detach(), "joint.action": pred_action.detach(), **gradients(policy)}
    policy.zero_grad(set_to_none=True)
    if model.video_expert.video_attention_mask_mode == "first_frame_causal":
        policy.eval()
        with torch.no_grad():
            first = inputs["latents"][:, :, :1]
            video_pre = model.video_expert.pre_dit(
                x=first,
                timestep=torch.zeros(BATCH),
                context=context,
                context_mask=mask,
                action=None,
                fuse_vae_embedding_in_latents=True,
            )
            video_len = int(video_pre["tokens"].shape[1])
            per_frame = int(video_pre["meta"]["tokens_per_frame"])
            joint_mask = model._build_mot_attention_mask(
                video_len, HORIZON, per_frame, video_pre["tokens"].device
            )
            cache = model.mot.prefill_video_cache(
                video_tokens=video_pre["tokens"],
                video_freqs=video_pre["freqs"],
                video_t_mod=video_pre["t_mod"],
                video_context_payload={"context": video_pre["context"], "mask": video_pre["context_mask"]},
                video_attention_mask=joint_mask[:video_len, :video_len],
            )
            out["cached.action"] = model._predict_action_noise_with_cache(
                inputs["noisy_action"], inputs["timestep_action"], context, mask, cache, joint_mask, video_len
            )
    return out


def full_size_lerobot(modeling) -> dict:
    from lerobot.policies.fastwam.configuration_fastwam import FastWAMConfig

    figures = {}
    for freeze in (False, True):
        config = FastWAMConfig(freeze_video_expert=freeze, base_model_id=None, load_text_encoder=False)
        config.device = "meta"
        META_BUILD[0] = True
        try:
            policy = modeling.FastWAMPolicy(config)
        finally:
            META_BUILD[0] = False
        figures[f"freeze={freeze}"] = _full_size_figures(policy)
    return figures


def lerobot_check(work: Path) -> bool:
    import logging

    import draccus
    from lerobot.configs.policies import PreTrainedConfig

    logging.disable(logging.WARNING)
    # LeRobot's fp32 regions are CUDA autocast contexts: on the CPU each warns that it is off
    warnings.filterwarnings("ignore", message="CUDA is not available")
    modeling = _lerobot_patched()
    (work / FULL_SIZE_FILE["lerobot"]).write_text(json.dumps(full_size_lerobot(modeling)))
    ok, report = True, {}
    for index, case in enumerate(CASES):
        ours_dir = work / case / "ours"
        config = PreTrainedConfig.from_pretrained(str(ours_dir))
        written = json.loads((ours_dir / "config.json").read_text())
        parsed = json.loads(json.dumps(draccus.encode(config, PreTrainedConfig)))
        differ = sorted(k for k in written if k not in ("device", "type") and parsed.get(k) != written[k])
        if differ:
            print(f"[lerobot] {case}: LeRobot reads our config.json differently in {differ}")
            ok = False
        config.device = "cpu"
        policy = modeling.FastWAMPolicy(config)
        state = load_file(str(ours_dir / "model.safetensors"))
        own = policy.state_dict()
        dtypes = sorted(k for k in state if k in own and own[k].dtype != state[k].dtype)
        if dtypes:
            print(f"[lerobot] {case}: our file's dtypes differ from LeRobot's model on {dtypes[:5]}")
            ok = False
        policy.load_state_dict(state, strict=True)
        inputs = load_inputs(work / case / "inputs.safetensors")
        passed, figures = compare(
            f"lerobot {case}",
            load_file(str(ours_dir / "reference.safetensors")),
            lerobot_outputs(policy, inputs),
        )
        ok &= passed
        report[case] = figures
        torch.manual_seed(400 + index)
        theirs = modeling.FastWAMPolicy(config)
        perturb_constants(theirs, 500 + index)
        out_dir = work / case / "lerobot"
        theirs.save_pretrained(str(out_dir))
        save_file(
            {k: v.contiguous() for k, v in lerobot_outputs(theirs, inputs).items()},
            str(out_dir / "reference.safetensors"),
        )
    (work / "lerobot_report.json").write_text(json.dumps(report))
    return ok


# ---------------------------------------------------------------- driver


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"]
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot 0.6.1 (with diffusers) is installed",
    )
    args = parser.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    if args.mode == "ours-write":
        ours_write(args.dir)
        return 0
    if args.mode == "ours-check":
        return 0 if ours_check(args.dir)[0] else 1
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.dir) else 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fastwam-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ours_write(work)
        me = str(Path(__file__).resolve())
        lerobot = subprocess.run([args.lerobot_python, me, "lerobot-check", str(work)], check=False)
        report_file = work / "lerobot_report.json"
        lerobot_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        ours_ok, ours_figures = False, {}
        if all((work / case / "lerobot" / "reference.safetensors").is_file() for case in CASES):
            ours_ok, ours_figures = ours_check(work)
    for case, numbers in lerobot_report.items():
        print(f"LeRobot on our weights, {case}: max |Δ| {numbers}")
    for what, numbers in ours_figures.items():
        print(f"ours on LeRobot's {what}: {numbers}")
    print(
        f"LeRobot computes ours: {'PASS' if lerobot.returncode == 0 else 'FAIL'}; we compute LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'} ({time.perf_counter() - start:.0f} s)"
    )
    return 0 if lerobot.returncode == 0 and ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Check that ACT ``pretrained_model/`` directories cross between this trainer and LeRobot, both ways.

LeRobot needs its own environment (0.6.x: Python ≥ 3.12, torch < 2.12), so this script runs in two
interpreters and hands files between them:

    uv venv --python 3.12 /tmp/lerobot-venv    # e.g. --python ~/.pyenv/versions/3.12.1/bin/python
    uv pip install --python /tmp/lerobot-venv/bin/python 'lerobot==0.6.*'   # 0.6.1: torch 2.11, ~5 GB
    uv run python tools/interop/act_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

1. ours-write     (our env)     build small ACTs (one per variant), processors with random stats, save
                                them; record inputs and our outputs in reference.safetensors.
2. lerobot-check  (LeRobot env) load that directory with LeRobot's ``ACTPolicy.from_pretrained`` and
                                ``make_pre_post_processors``; compare key sets, the action chunk and the
                                training loss; then write a LeRobot-made directory with its own reference.
3. ours-check     (our env)     load LeRobot's directory with ``load_pretrained`` / ``load_processors``
                                and compare the same way.

``lerobot-fixture DIR`` (LeRobot env) writes the small camera-less LeRobot checkpoint that the unit
tests keep in packages/lerobot-cli/tests/data/lerobot_act_env/, and ``lerobot-keys FILE`` the list of
LeRobot's state-dict keys in packages/lerobot-cli/tests/data/act_small_keys.txt.
``--variant`` limits the round trip to one config ("vae": post-norm with VAE, camera + state + env;
"prenorm": pre-norm, GELU, no VAE, two cameras of different sizes named ``observation.wrist_rgb`` and
``observation.top``, wrist first, two decoder layers: LeRobot takes every VISUAL feature in the config's
order, never a key prefix, and so must we). Exit status 0 means every comparison passed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ATOL = 1e-4
SMALL = {
    "chunk_size": 5,
    "n_action_steps": 5,
    "dim_model": 32,
    "n_heads": 4,
    "dim_feedforward": 64,
    "n_encoder_layers": 2,
    "n_decoder_layers": 1,
    "n_vae_encoder_layers": 2,
    "latent_dim": 8,
    "dropout": 0.0,
    "kl_weight": 10.0,
}
# name -> (feature type, shape)
FEATURES = {
    "observation.state": ("STATE", (4,)),
    "observation.environment_state": ("ENV", (3,)),
    "observation.images.top": ("VISUAL", (3, 64, 64)),
    "action": ("ACTION", (2,)),
}
CAMERALESS = {k: v for k, v in FEATURES.items() if v[0] != "VISUAL"}
# Each variant: (features, config overrides). "vae": the default post-norm ACT with a VAE;
# "prenorm": pre-norm, GELU, no VAE, two cameras of different sizes, no env state, two decoder layers; the
# cameras have no observation.images prefix and are not in alphabetical order (the config's order counts).
VARIANTS = {
    "vae": (FEATURES, {}),
    "prenorm": (
        {
            "observation.state": ("STATE", (4,)),
            "observation.wrist_rgb": ("VISUAL", (3, 32, 48)),
            "observation.top": ("VISUAL", (3, 64, 64)),
            "action": ("ACTION", (3,)),
        },
        {"pre_norm": True, "use_vae": False, "feedforward_activation": "gelu", "n_decoder_layers": 2},
    ),
}


def make_stats(features: dict, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    stats = {}
    for key, (kind, shape) in features.items():
        dim = shape[0]
        shp = (dim, 1, 1) if kind == "VISUAL" else (dim,)
        stats[key] = {
            "mean": torch.rand(shp, generator=g),
            "std": 0.5 + torch.rand(shp, generator=g),
            "min": -1 - torch.rand(shp, generator=g),
            "max": 1 + torch.rand(shp, generator=g),
        }
    return stats


def make_inputs(features: dict, seed: int, batch: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, (kind, shape) in features.items():
        if kind == "VISUAL":
            out[key] = torch.rand((batch, *shape), generator=g)
        elif kind == "ACTION":
            out[key] = torch.randn((batch, SMALL["chunk_size"], *shape), generator=g)
        else:
            out[key] = torch.randn((batch, *shape), generator=g)
    pad = torch.zeros(batch, SMALL["chunk_size"], dtype=torch.bool)
    pad[0, -2:] = True  # episode end inside the chunk of the first sample
    out["action_is_pad"] = pad
    return out


def perturb_frozen_bn(module: torch.nn.Module, seed: int) -> None:
    """Random BN statistics: a freshly built backbone has identity BN, which would hide BN bugs."""
    g = torch.Generator().manual_seed(seed)
    for name, buf in module.named_buffers():
        if ".backbone." in f".{name}" and buf.dim() == 1:
            if name.endswith("running_var"):
                buf.copy_(0.5 + torch.rand(buf.shape, generator=g))
            else:
                buf.copy_(0.1 * torch.randn(buf.shape, generator=g))


def run_policy(policy, pre, post, inputs: dict) -> dict[str, torch.Tensor]:
    """Eval chunk through pre/post processors, and the training loss at a fixed RNG state."""
    obs = {k: v for k, v in inputs.items() if k.startswith("observation.")}
    chunk = post(policy.predict_action_chunk(pre(obs)))
    policy.train()
    torch.manual_seed(1234)  # the VAE draws one randn_like(mu): same seed, same latent sample
    loss, info = policy.forward(pre(dict(inputs)))
    policy.eval()
    # floats in LeRobot, detached 0-d tensors in ours (as_tensor takes both); cloned, because ours may be
    # the loss tensor itself (l1 without the VAE) and safetensors refuses tensors that share memory
    return {
        "out.chunk": chunk.detach().float(),
        "out.loss": loss.detach().reshape(1).clone(),
        "out.l1": torch.as_tensor(info["l1_loss"], dtype=torch.float32).reshape(1).cpu().clone(),
        "out.kld": torch.as_tensor(info.get("kld_loss", 0.0), dtype=torch.float32).reshape(1).cpu().clone(),
    }


def compare(tag: str, ref: dict, got: dict) -> bool:
    ok = True
    for key in ("out.chunk", "out.l1", "out.kld", "out.loss"):
        diff = (ref[key] - got[key]).abs().max().item()
        good = diff <= ATOL * max(1.0, ref[key].abs().max().item())
        ok &= good
        print(f"[{tag}] {key:10s} max|Δ| = {diff:.2e} {'ok' if good else 'MISMATCH'}")
    return ok


def check_keys(tag: str, policy, weights_file: Path) -> bool:
    file_keys = set(load_file(str(weights_file)))
    model_keys = set(policy.state_dict())
    missing, unexpected = sorted(model_keys - file_keys), sorted(file_keys - model_keys)
    print(
        f"[{tag}] state-dict keys: {len(model_keys)} in model, {len(file_keys)} in file, "
        f"missing {missing[:5]}, unexpected {unexpected[:5]}"
    )
    return not missing and not unexpected


def save_reference(path: Path, inputs: dict, outputs: dict) -> None:
    save_file({**{f"in.{k}": v.contiguous() for k, v in inputs.items()}, **outputs}, str(path))


def load_reference(path: Path) -> tuple[dict, dict]:
    data = load_file(str(path))
    inputs = {k[3:]: v for k, v in data.items() if k.startswith("in.")}
    return inputs, {k: v for k, v in data.items() if k.startswith("out.")}


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def ours_write(work: Path, variant: str) -> None:
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy
    from lerobot_cli.policies.pretrained import save_pretrained
    from lerobot_cli.processors import make_pre_post_processors, save_processors

    features, overrides = VARIANTS[variant]
    feats = {k: PolicyFeature(type=t, shape=s) for k, (t, s) in features.items()}
    cfg = ACTConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        device="cpu",
        pretrained_backbone_weights=None,
        **{**SMALL, **overrides},
    )
    torch.manual_seed(0)
    policy = ACTPolicy(cfg)
    with torch.no_grad():
        perturb_frozen_bn(policy, 1)
    pre, post = make_pre_post_processors(cfg, make_stats(features, 2))
    out = work / f"ours_{variant}"
    save_pretrained(policy, cfg, out)
    save_processors(pre, post, out)
    inputs = make_inputs(features, 3)
    save_reference(out / "reference.safetensors", inputs, run_policy(policy.eval(), pre, post, inputs))
    print(f"[ours-write] wrote {out}")


def ours_check(work: Path, variant: str) -> bool:
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.processors import load_processors

    src = work / f"lerobot_{variant}"
    _, policy = load_pretrained(src)
    pre, post = load_processors(src)
    inputs, ref = load_reference(src / "reference.safetensors")
    tag = f"ours<-lerobot {variant}"
    ok = check_keys(tag, policy, src / "model.safetensors")
    return compare(tag, ref, run_policy(policy, pre, post, inputs)) and ok


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def _lerobot_make(features: dict, overrides: dict, seed: int):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    feats = {k: PolicyFeature(type=FeatureType[t], shape=s) for k, (t, s) in features.items()}
    cfg = ACTConfig(
        input_features={k: f for k, f in feats.items() if k != "action"},
        output_features={"action": feats["action"]},
        pretrained_backbone_weights=None,
        device="cpu",
        **{**SMALL, **overrides},
    )
    torch.manual_seed(seed)
    policy = ACTPolicy(cfg)
    with torch.no_grad():
        perturb_frozen_bn(policy, seed + 1)
    pre, post = make_pre_post_processors(cfg, dataset_stats=make_stats(features, seed + 2))
    return policy.eval(), pre, post


def lerobot_check(work: Path, variant: str) -> bool:
    from lerobot.policies.act.modeling_act import ACTPolicy
    from lerobot.policies.factory import make_pre_post_processors

    src = work / f"ours_{variant}"
    policy = ACTPolicy.from_pretrained(str(src))
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(src))
    inputs, ref = load_reference(src / "reference.safetensors")
    tag = f"lerobot<-ours {variant}"
    ok = check_keys(tag, policy, src / "model.safetensors")
    ok = compare(tag, ref, run_policy(policy, pre, post, inputs)) and ok

    features, overrides = VARIANTS[variant]
    policy, pre, post = _lerobot_make(features, overrides, 10)
    out = work / f"lerobot_{variant}"
    policy.save_pretrained(str(out))
    pre.save_pretrained(str(out))
    post.save_pretrained(str(out))
    inputs = make_inputs(features, 13)
    save_reference(out / "reference.safetensors", inputs, run_policy(policy, pre, post, inputs))
    print(f"[lerobot-check] wrote {out}")
    return ok


def lerobot_fixture(out: Path) -> None:
    policy, pre, post = _lerobot_make(CAMERALESS, {}, 20)
    policy.save_pretrained(str(out))
    pre.save_pretrained(str(out))
    post.save_pretrained(str(out))
    inputs = make_inputs(CAMERALESS, 23)
    save_reference(out / "reference.safetensors", inputs, run_policy(policy, pre, post, inputs))
    print(f"[lerobot-fixture] wrote {out}")


def lerobot_keys(out: Path) -> None:
    """Write LeRobot's state-dict keys and shapes for the "vae" variant (the unit tests' key list)."""
    policy, _, _ = _lerobot_make(FEATURES, {}, 0)
    header = (
        "# state_dict keys and shapes of LeRobot's ACTPolicy, written by "
        "tools/interop/act_lerobot_interop.py lerobot-keys\n"
        "# (state 4, env 3, one camera, action 2, chunk 5, dim_model 32, 2 enc / 1 dec / 2 VAE layers, "
        "latent 8).\n"
    )
    lines = [f"{k} {tuple(v.shape)}" for k, v in policy.state_dict().items()]
    out.write_text(header + "\n".join(lines) + "\n")
    print(f"[lerobot-keys] wrote {len(lines)} keys to {out}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "mode",
        nargs="?",
        default="run",
        choices=["run", "ours-write", "ours-check", "lerobot-check", "lerobot-fixture", "lerobot-keys"],
    )
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        action="append",
        help="config variant(s) to check (default: all)",
    )
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="interpreter of the environment where LeRobot is installed",
    )
    args = parser.parse_args()
    variants = args.variant or sorted(VARIANTS)
    if args.mode == "ours-write":
        for v in variants:
            ours_write(args.dir, v)
        return 0
    if args.mode == "ours-check":
        results = [ours_check(args.dir, v) for v in variants]  # run every variant, then judge
        return 0 if all(results) else 1
    if args.mode == "lerobot-check":
        results = [lerobot_check(args.dir, v) for v in variants]
        return 0 if all(results) else 1
    if args.mode == "lerobot-keys":
        lerobot_keys(args.dir)
        return 0
    if args.mode == "lerobot-fixture":
        lerobot_fixture(args.dir)
        return 0
    work = args.dir or Path(tempfile.mkdtemp(prefix="act-interop-"))
    work.mkdir(parents=True, exist_ok=True)
    me = str(Path(__file__).resolve())
    for v in variants:
        ours_write(work, v)
    flags = [arg for v in variants for arg in ("--variant", v)]
    lerobot = subprocess.run([args.lerobot_python, me, "lerobot-check", str(work), *flags], check=False)
    lerobot_ok = lerobot.returncode == 0
    ours_ok = all([ours_check(work, v) for v in variants])  # noqa: C419 - check every variant
    print(
        f"LeRobot loads ours: {'PASS' if lerobot_ok else 'FAIL'}; we load LeRobot's: "
        f"{'PASS' if ours_ok else 'FAIL'}"
    )
    return 0 if lerobot_ok and ours_ok else 1


if __name__ == "__main__":
    sys.exit(main())

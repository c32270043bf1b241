"""Check that our pi0 and LeRobot 0.6.1's compute the same thing, both ways across model.safetensors.

LeRobot needs its own environment (Python 3.12, ``lerobot[pi]==0.6.1``, transformers 5.5), so, like
act_lerobot_interop.py, this script runs in two interpreters and hands files between them:

    uv run python tools/interop/pi0_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

1. ours-write     (our env)     the full-size state-dict keys and shapes, built on the meta device; a seeded
                                tiny pi0 saved as model.safetensors; a batch (camera 48x64, resized with
                                padding; state 6; action 6; language tokens padded differently per row),
                                training noise and time, inference noise; our per-element losses, loss, action
                                chunk and gradients as reference.
2. lerobot-check  (LeRobot env) LeRobot's full-size PI0Policy on the meta device: same keys and shapes. Its
                                tiny PI0Policy (see ``_patch_lerobot_for_tiny``) loads our file with
                                ``load_state_dict(strict=True)`` and recomputes the reference; then a seeded
                                LeRobot tiny pi0 is written with its own ``save_pretrained`` with its outputs.
3. ours-check     (our env)     that directory through our ``--policy.path`` loader (``resolve_policy_dir``,
                                ``load_policy_config``, ``load_pretrained``) and the same comparisons.

LeRobot only builds gemma_2b / gemma_300m with SigLIP so400m; the tiny sizes come from monkeypatching its
modules in the LeRobot process (never its files): ``modeling_pi0.get_gemma_config`` knows gemma_tiny, the
config's variant fields are set after its validation ran, and the PaliGemma class it builds gets our tiny
SigLIP sizes (LeRobot hard-sets intermediate_size 4304 / projection_dim 2048 on the vision config just
before). Everything runs in fp32 on the CPU. Exit status 0 means every comparison passed.
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
from safetensors.torch import load_file, save_file

ATOL = 1e-5       # losses and action chunks, max |Δ|
GRAD_RTOL = 1e-5  # gradients, max |Δ| / max |reference|
FULL_KEYS, FULL_VALUES = 778, 4_028_019_472  # LeRobot 0.6.1 pi0 at its default variants (issue 15)
BATCH, CHUNK, STATE_DIM, ACTION_DIM, TOKENS = 3, 4, 6, 6, 8
CAMERA = "observation.images.top"
CAMERA_SHAPE = (3, 48, 64)  # not the 56x56 resolution: both sides resize with padding
TOKEN_LENGTHS = (8, 5, 3)   # real tokens per row; the rest is padding
TINY = {"chunk_size": CHUNK, "n_action_steps": CHUNK, "image_resolution": (56, 56), "max_state_dim": 32,
        "max_action_dim": 32}
OURS_TINY = {**TINY, "paligemma_variant": "gemma_tiny", "action_expert_variant": "gemma_tiny", "vision_variant": "tiny"}
PREFIX = "model.paligemma_with_expert."
GRAD_PARAMS = (
    PREFIX + "gemma_expert.model.layers.0.self_attn.q_proj.weight",
    PREFIX + "gemma_expert.model.layers.1.input_layernorm.weight",
    PREFIX + "gemma_expert.model.norm.weight",
    PREFIX + "paligemma.model.language_model.layers.0.mlp.down_proj.weight",
    PREFIX + "paligemma.model.language_model.layers.1.self_attn.k_proj.weight",
    PREFIX + "paligemma.model.language_model.embed_tokens.weight",
    PREFIX + "paligemma.model.multi_modal_projector.linear.weight",
    PREFIX + "paligemma.model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight",
    PREFIX + "paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
    "model.state_proj.weight",
    "model.action_time_mlp_in.weight",
    "model.action_out_proj.bias",
)


# ---------------------------------------------------------------- shared (both interpreters)

def make_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(TOKEN_LENGTHS)
    return {
        f"batch.{CAMERA}": torch.rand((BATCH, *CAMERA_SHAPE), generator=g),
        "batch.observation.state": torch.randn(BATCH, STATE_DIM, generator=g),
        "batch.action": torch.randn(BATCH, CHUNK, ACTION_DIM, generator=g),
        "batch.observation.language.tokens": torch.randint(0, 257_152, (BATCH, TOKENS), generator=g),
        "batch.observation.language.attention_mask": torch.arange(TOKENS)[None] < lengths[:, None],
        "noise": torch.randn(BATCH, CHUNK, 32, generator=g),
        "time": torch.rand(BATCH, generator=g) * 0.999 + 0.001,
        "chunk_noise": torch.randn(BATCH, CHUNK, 32, generator=g),
    }


def batch_of(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k[len("batch."):]: v.clone() for k, v in inputs.items() if k.startswith("batch.")}


@torch.no_grad()
def perturb_constants(module: torch.nn.Module, seed: int) -> None:
    """Random values for parameters built constant (norm scales, biases): a fresh model's zero Gemma norm
    weights and zero biases would hide a wrong ``1 + weight`` or a dropped bias."""
    g = torch.Generator().manual_seed(seed)
    for _, param in sorted(module.named_parameters()):
        if param.numel() == 1 or bool((param == param.flatten()[0]).all()):
            param.add_(0.1 * torch.randn(param.shape, generator=g))


def model_inputs(batch: dict[str, torch.Tensor], images, img_masks, state) -> tuple:
    tokens = batch["observation.language.tokens"]
    masks = batch["observation.language.attention_mask"]
    actions = torch.nn.functional.pad(batch["action"], (0, 32 - ACTION_DIM))
    return images, img_masks, tokens, masks, state, actions


def outputs_of(losses: torch.Tensor, loss: torch.Tensor, chunk: torch.Tensor, named: dict,
               grad_params: tuple[str, ...] = GRAD_PARAMS) -> dict[str, torch.Tensor]:
    out = {"out.losses": losses.detach(), "out.loss": loss.detach().reshape(1), "out.chunk": chunk.detach().contiguous()}
    for name in grad_params:
        grad = named[name].grad
        out[f"grad.{name}"] = torch.zeros_like(named[name]) if grad is None else grad.detach().clone()
    return out


def compare(tag: str, ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor],
            grad_params: tuple[str, ...] = GRAD_PARAMS) -> tuple[bool, dict]:
    """Max |Δ| of losses / loss / chunk (≤ ATOL) and relative max |Δ| of each gradient (≤ GRAD_RTOL)."""
    figures, ok = {}, True
    for key in ("out.losses", "out.loss", "out.chunk"):
        diff = (ref[key] - got[key]).abs().max().item()
        figures[key[4:]] = diff
        ok &= diff <= ATOL
    worst, worst_name = 0.0, ""
    for name in grad_params:
        r, g = ref[f"grad.{name}"], got[f"grad.{name}"]
        scale = r.abs().max().item()
        if scale == 0.0:  # a gradient that is zero on the reference side would compare nothing
            print(f"[{tag}] zero reference gradient for {name}")
            ok = False
            continue
        rel = (r - g).abs().max().item() / scale
        if rel > worst:
            worst, worst_name = rel, name
    figures["grad_rel"], figures["grad_worst"] = worst, worst_name
    ok &= worst <= GRAD_RTOL
    print(f"[{tag}] max|Δ| per-element losses {figures['losses']:.2e}, loss {figures['loss']:.2e}, "
          f"action chunk {figures['chunk']:.2e}; gradients of {len(grad_params)} parameters max rel|Δ| "
          f"{worst:.2e} ({worst_name.removeprefix(PREFIX)}) -> {'ok' if ok else 'MISMATCH'}")
    return ok, figures


def key_shapes(state_dict) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in state_dict.items()}


def run_ours(policy, inputs: dict[str, torch.Tensor], grad_params: tuple[str, ...] = GRAD_PARAMS) -> dict[str, torch.Tensor]:
    """Our PI0Policy: model-level per-element losses, forward's loss and its gradients, the action chunk."""
    from lerobot_cli.policies.pi0.modeling import PI0Policy

    assert isinstance(policy, PI0Policy)
    policy.train()
    policy.zero_grad(set_to_none=True)
    batch = batch_of(inputs)
    images, img_masks = policy._images(batch)
    args = model_inputs(batch, images, img_masks, policy._state(batch))
    with torch.no_grad():
        losses = policy.model(*args, inputs["noise"], inputs["time"])
    loss, _ = policy.forward(batch_of(inputs), noise=inputs["noise"], time=inputs["time"])
    loss.backward()
    chunk = policy.predict_action_chunk(batch_of(inputs), noise=inputs["chunk_noise"])
    return outputs_of(losses, loss, chunk, dict(policy.named_parameters()), grad_params)


# ---------------------------------------------------------------- our side (imports lerobot_cli)

def _our_features():
    from lerobot_cli.policies.features import FeatureType, PolicyFeature

    return {"input_features": {CAMERA: PolicyFeature(FeatureType.VISUAL, CAMERA_SHAPE),
                               "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))},
            "output_features": {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}}


def ours_write(work: Path) -> None:
    import attrs
    from lerobot_cli.policies.pi0.config import PI0Config
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from lerobot_cli.policies.pi0.variants import GEMMA_VARIANTS, VISION_VARIANTS

    start = time.perf_counter()
    # The tiny sizes LeRobot is taught (variants.py's gemma_tiny and tiny SigLIP), in transformers' names
    vision = VISION_VARIANTS["tiny"]
    (work / "tiny_sizes.json").write_text(json.dumps({
        "gemma": attrs.asdict(GEMMA_VARIANTS["gemma_tiny"]),
        "vision": {"hidden_size": vision.hidden_size, "num_hidden_layers": vision.depth,
                   "num_attention_heads": vision.num_heads, "intermediate_size": vision.intermediate_size,
                   "patch_size": vision.patch_size}}))
    with torch.device("meta"):
        full = PI0Policy(PI0Config(**_our_features()))
    (work / "ours_full_keys.json").write_text(json.dumps(key_shapes(full.state_dict())))
    del full

    torch.manual_seed(0)
    policy = PI0Policy(PI0Config(**OURS_TINY, **_our_features()))
    perturb_constants(policy, 1)
    out = work / "ours"
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in policy.state_dict().items()}, str(out / "model.safetensors"))
    inputs = make_inputs(2)
    save_file(inputs, str(work / "inputs.safetensors"))
    save_file(run_ours(policy, inputs), str(out / "reference.safetensors"))
    print(f"[ours-write] wrote {out} ({time.perf_counter() - start:.1f} s)")


def ours_check(work: Path, grad_params: tuple[str, ...] = GRAD_PARAMS) -> tuple[bool, dict]:
    import attrs
    from lerobot_cli.policies.location import resolve_policy_dir
    from lerobot_cli.policies.pretrained import load_pretrained
    from lerobot_cli.policies.serialization import load_policy_config

    # What --policy.path=<LeRobot's dir> --policy.vision_variant=tiny does: LeRobot's config.json read by
    # our parser, one flag applied on top (LeRobot has no such field: its tower is always so400m), then
    # our loader builds the policy and loads LeRobot's model.safetensors strictly.
    src = resolve_policy_dir(str(work / "lerobot"))
    config = attrs.evolve(load_policy_config(src), vision_variant="tiny")
    _, policy = load_pretrained(src, config=config)
    file_keys = set(load_file(str(src / "model.safetensors")))
    model_keys = set(policy.state_dict())
    keys_ok = file_keys == model_keys
    print(f"[ours<-lerobot] LeRobot's save_pretrained file: {len(file_keys)} keys, our model {len(model_keys)}, "
          f"{'identical' if keys_ok else 'DIFFERENT'}")
    inputs = load_file(str(work / "inputs.safetensors"))
    ok, figures = compare("ours<-lerobot", load_file(str(src / "reference.safetensors")),
                          run_ours(policy, inputs, grad_params), grad_params)
    figures["keys"] = len(file_keys)
    return ok and keys_ok, figures


# ---------------------------------------------------------------- LeRobot side (imports lerobot)

def _lerobot_config(**overrides):
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.pi0.configuration_pi0 import PI0Config

    return PI0Config(device="cpu", input_features={CAMERA: PolicyFeature(FeatureType.VISUAL, CAMERA_SHAPE),
                                                   "observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))},
                     output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}, **overrides)


def _patch_lerobot_for_tiny(sizes: dict, modeling_pi0=None) -> None:
    """Teach LeRobot's modeling_pi0 module (or modeling_pi05, which builds the same way) our gemma_tiny and
    tiny SigLIP (module attributes only)."""
    if modeling_pi0 is None:
        from lerobot.policies.pi0 import modeling_pi0

    if getattr(modeling_pi0, "_interop_tiny", False):
        return
    known = modeling_pi0.get_gemma_config

    def get_gemma_config(variant: str):
        return modeling_pi0.GemmaConfig(**sizes["gemma"]) if variant == "gemma_tiny" else known(variant)

    base = modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma

    class TinyVisionPaliGemma(base):
        """LeRobot's PaliGemma class, with the vision config set to our tiny tower when it is built (after
        PaliGemmaWithExpertModel wrote so400m's intermediate_size and projection_dim=2048 into it)."""

        def __init__(self, config):
            for name, value in sizes["vision"].items():
                setattr(config.vision_config, name, value)
            config.vision_config.projection_dim = config.text_config.hidden_size  # the VLM width, as ours
            super().__init__(config)

    modeling_pi0.get_gemma_config = get_gemma_config
    modeling_pi0.PaliGemmaForConditionalGenerationWithPiGemma = TinyVisionPaliGemma
    modeling_pi0._interop_tiny = True


def _lerobot_tiny(work: Path, seed: int):
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    _patch_lerobot_for_tiny(json.loads((work / "tiny_sizes.json").read_text()))
    config = _lerobot_config(**TINY)
    # PI0Config.__post_init__ accepts only gemma_2b / gemma_300m: set the tiny variant after it ran
    config.paligemma_variant = config.action_expert_variant = "gemma_tiny"
    torch.manual_seed(seed)
    return PI0Policy(config)


def run_lerobot(policy, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """LeRobot's PI0Policy: ``model.forward``'s per-element losses, ``forward``'s loss and gradients, and
    ``predict_action_chunk``, with its noise/time samplers patched to return the given tensors."""
    model = policy.model
    policy.train()
    policy.zero_grad(set_to_none=True)
    batch = batch_of(inputs)
    images, img_masks = policy._preprocess_images(batch)
    args = model_inputs(batch, images, img_masks, policy.prepare_state(batch))
    with torch.no_grad():
        losses = model.forward(*args, inputs["noise"], inputs["time"])
    model.sample_noise = lambda shape, device: inputs["noise"].clone()
    model.sample_time = lambda bsize, device: inputs["time"].clone()
    loss, _ = policy.forward(batch_of(inputs))
    loss.backward()
    model.sample_noise = lambda shape, device: inputs["chunk_noise"].clone()
    chunk = policy.predict_action_chunk(batch_of(inputs))
    del model.sample_noise, model.sample_time
    return outputs_of(losses, loss, chunk, dict(policy.named_parameters()))


def lerobot_full_keys(work: Path) -> tuple[bool, dict]:
    from lerobot.policies.pi0.modeling_pi0 import PI0Policy

    config = _lerobot_config()
    config.device = "meta"
    with torch.device("meta"):
        policy = PI0Policy(config)
    return compare_full_keys(key_shapes(policy.state_dict()), json.loads((work / "ours_full_keys.json").read_text()),
                             FULL_KEYS, FULL_VALUES)


def compare_full_keys(theirs: dict, ours: dict, full_keys: int, full_values: int) -> tuple[bool, dict]:
    """LeRobot's and our full-size key -> shape maps: same names, same shapes, the expected counts."""
    values = {side: sum(int(torch.Size(s).numel()) for s in d.values()) for side, d in (("lerobot", theirs), ("ours", ours))}
    missing, unexpected = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    shapes = sorted(k for k in set(theirs) & set(ours) if theirs[k] != ours[k])
    ok = (not missing and not unexpected and not shapes and len(theirs) == full_keys
          and values["lerobot"] == values["ours"] == full_values)
    print(f"[full size] keys: LeRobot {len(theirs)}, ours {len(ours)} (expected {full_keys}); values: LeRobot "
          f"{values['lerobot']:,}, ours {values['ours']:,} (expected {full_values:,}); missing in ours {missing[:4]}, "
          f"extra in ours {unexpected[:4]}, shape differences {shapes[:4]} -> {'ok' if ok else 'MISMATCH'}")
    return ok, {"keys_lerobot": len(theirs), "keys_ours": len(ours), "values_lerobot": values["lerobot"],
                "values_ours": values["ours"], "missing": len(missing), "unexpected": len(unexpected),
                "shape_diffs": len(shapes)}


def lerobot_check(work: Path) -> bool:
    start = time.perf_counter()
    report: dict = {}
    full_ok, report["full"] = lerobot_full_keys(work)

    policy = _lerobot_tiny(work, 100)  # its own seeded weights, all replaced by ours below
    state = load_file(str(work / "ours" / "model.safetensors"))
    try:
        policy.load_state_dict(state, strict=True)
        load_ok = True
        print(f"[lerobot<-ours] load_state_dict(strict=True) of our {len(state)}-key file: ok")
    except RuntimeError as exc:
        load_ok = False
        print(f"[lerobot<-ours] load_state_dict(strict=True) FAILED: {str(exc)[:2000]}")
    inputs = load_file(str(work / "inputs.safetensors"))
    if load_ok:
        ok, report["lerobot<-ours"] = compare("lerobot<-ours", load_file(str(work / "ours" / "reference.safetensors")),
                                              run_lerobot(policy, inputs))
        report["lerobot<-ours"]["keys"] = len(state)
    else:
        ok = False

    policy = _lerobot_tiny(work, 10)
    perturb_constants(policy, 11)
    out = work / "lerobot"
    policy.save_pretrained(str(out))
    save_file(run_lerobot(policy, inputs), str(out / "reference.safetensors"))
    print(f"[lerobot-check] wrote {out} ({time.perf_counter() - start:.1f} s)")
    report["ok"] = {"full": full_ok, "lerobot<-ours": load_ok and ok}
    (work / "lerobot_report.json").write_text(json.dumps(report))
    return full_ok and load_ok and ok


# ---------------------------------------------------------------- driver

def print_report(lerobot: dict, ours: dict | None, ours_ok: bool, policy: str = "pi0") -> None:
    full = lerobot.get("full", {})
    print(f"{policy} interop with LeRobot 0.6.1 (fp32, CPU)")
    if full:
        print(f"  full size (meta): keys {full['keys_ours']} ours / {full['keys_lerobot']} LeRobot, values "
              f"{full['values_ours']:,} / {full['values_lerobot']:,}, missing {full['missing']}, extra "
              f"{full['unexpected']}, shape diffs {full['shape_diffs']}: {'PASS' if lerobot['ok']['full'] else 'FAIL'}")
    rows = [("ours -> LeRobot", lerobot.get("lerobot<-ours"), lerobot.get("ok", {}).get("lerobot<-ours", False)),
            ("LeRobot -> ours", ours, ours_ok)]
    for label, fig, ok in rows:
        if not fig:
            print(f"  {label}: FAIL (no figures)")
            continue
        print(f"  {label}: {fig['keys']} keys loaded strictly; max|Δ| losses {fig['losses']:.2e}, loss {fig['loss']:.2e}, "
              f"chunk {fig['chunk']:.2e}; grads rel {fig['grad_rel']:.2e}: {'PASS' if ok else 'FAIL'}")


def main(policy: str = "pi0", script: str = __file__, steps: tuple | None = None) -> int:
    """The driver (argument parsing, both interpreters, the report). Another policy's script passes its
    name, its own file (the LeRobot interpreter runs it) and ``steps``: its (ours_write, ours_check,
    lerobot_check, report) functions, with the signatures of this module's."""
    write, check, lerobot_side, report = steps or (ours_write, ours_check, lerobot_check, print_report)
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "ours-write", "ours-check", "lerobot-check"])
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--lerobot-python", default="/tmp/lerobot-venv/bin/python",
                        help="interpreter of the environment where LeRobot (with its [pi] extra) is installed")
    args = parser.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    if args.mode == "ours-write":
        write(args.dir)
        return 0
    if args.mode == "ours-check":
        return 0 if check(args.dir)[0] else 1
    if args.mode == "lerobot-check":
        return 0 if lerobot_side(args.dir) else 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{policy}-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        write(work)
        lerobot = subprocess.run([args.lerobot_python, str(Path(script).resolve()), "lerobot-check", str(work)],
                                 check=False)
        report_file = work / "lerobot_report.json"
        lerobot_report = json.loads(report_file.read_text()) if report_file.is_file() else {}
        ours_ok, ours_figures = False, None
        if (work / "lerobot" / "reference.safetensors").is_file():
            ours_ok, ours_figures = check(work)
        report(lerobot_report, ours_figures, ours_ok)
    passed = lerobot.returncode == 0 and ours_ok
    print(f"LeRobot computes ours: {'PASS' if lerobot.returncode == 0 else 'FAIL'}; we compute LeRobot's: "
          f"{'PASS' if ours_ok else 'FAIL'} ({time.perf_counter() - start:.0f} s)")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())

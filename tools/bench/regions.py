"""Activation checkpointing and compile, measured side by side in one process.

Part 1 (checkpointing): for ACT at LeRobot's default size (demo camera 64x64) and a tiny-but-deep pi0,
the bytes autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``) and the time of one
training step (forward, backward, AdamW) with ``accelerator.activation_checkpointing.mode`` none, full and
selective, through ``build_plan`` + ``wrap_model`` as lerobot-train applies them.

Part 2 (compile): steps/s of ACT eager vs regional compile (each wrap unit) vs whole-policy compile with
inductor on this machine's CPU, after a warm-up that pays the compile, plus the compile time itself.

The variants' steps are interleaved (round-robin, one step each) so a noisy machine slows them alike;
ratios are to the plain eager run of the same round.

    uv run python tools/bench/regions.py [--steps 10] [--batch-size 8] [--skip-compile] [--threads N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import attrs
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "lerobot-cli" / "tests"))


def act_policy(**overrides):
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy

    inputs = {
        "observation.state": PolicyFeature("STATE", (2,)),
        "observation.images.top": PolicyFeature("VISUAL", (3, 64, 64)),
    }
    cfg = ACTConfig(
        input_features=inputs,
        output_features={"action": PolicyFeature("ACTION", (2,))},
        pretrained_backbone_weights=None,
        **overrides,
    )
    return lambda: ACTPolicy(cfg), cfg


def act_batch(cfg, batch_size: int) -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "observation.state": torch.randn(batch_size, 2, generator=g),
        "observation.images.top": torch.rand(batch_size, 3, 64, 64, generator=g),
        "action": torch.randn(batch_size, cfg.chunk_size, 2, generator=g),
        "action_is_pad": torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool),
    }


def pi0_case(depth: int, batch_size: int):
    """pi0 with the tiny widths and ``depth`` joint layer pairs (and SigLIP layers), as the tests build it."""
    from lerobot_cli.policies.common.paligemma import variants
    from lerobot_cli.policies.pi0.modeling import PI0Policy
    from test_policy_pi0 import batch, tiny

    variants.GEMMA_VARIANTS["gemma_tiny"] = attrs.evolve(variants.GEMMA_VARIANTS["gemma_tiny"], depth=depth)
    variants.VISION_VARIANTS["tiny"] = attrs.evolve(variants.VISION_VARIANTS["tiny"], depth=depth)
    b = batch(min(batch_size, 4))
    noise, t = torch.randn(b["action"].shape[0], 4, 32), torch.full((b["action"].shape[0],), 0.4)
    return lambda: PI0Policy(tiny()), (lambda m: m(b, noise=noise, time=t))


class Variant:
    """One wrapped model, its optimizer and a step function; ``saved`` = bytes kept for backward."""

    def __init__(self, name: str, model_fn, run, accelerator) -> None:
        from lerobot_parallel import ParallelismConfig
        from lerobot_parallel.plan import build_plan
        from lerobot_parallel.runtime import ParallelRuntime
        from lerobot_parallel.wrap import wrap_model

        torch.manual_seed(0)
        rt = ParallelRuntime.preview(ParallelismConfig())
        model = model_fn()
        self.name = name
        self.model = wrap_model(model, rt, build_plan(model, rt, accelerator)).model
        self.opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
        self.run = run
        self.times: list[float] = []
        self.saved = 0

    def step(self, measure_bytes: bool = False) -> float:
        from lerobot_parallel.testing import saved_tensor_bytes

        t0 = time.perf_counter()
        if measure_bytes:
            (loss, _), self.saved = saved_tensor_bytes(lambda: self.run(self.model))
        else:
            loss, _ = self.run(self.model)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0


def interleave(variants: list[Variant], steps: int, warmup: int) -> None:
    for v in variants:
        v.step(measure_bytes=True)
        for _ in range(warmup - 1):
            v.step()
    for _ in range(steps):
        for v in variants:
            v.times.append(v.step())


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def checkpointing_table(title: str, model_fn, run, steps: int) -> None:
    from lerobot_parallel import AcceleratorConfig
    from lerobot_parallel.config import ActivationCheckpointingConfig

    variants = [
        Variant(
            mode,
            model_fn,
            run,
            AcceleratorConfig(activation_checkpointing=ActivationCheckpointingConfig(mode)),
        )
        for mode in ("none", "full", "selective")
    ]
    interleave(variants, steps, warmup=2)
    base = variants[0]
    print(f"\n{title}")
    print(f"  {'mode':<10} {'saved for backward':>20} {'x none':>8} {'step s (median)':>16} {'x none':>8}")
    for v in variants:
        print(
            f"  {v.name:<10} {v.saved / 2**20:>16.2f} MiB {v.saved / base.saved:>8.3f} "
            f"{median(v.times):>16.4f} {median(v.times) / median(base.times):>8.3f}"
        )


def compile_table(steps: int, batch_size: int) -> None:
    from lerobot_parallel import AcceleratorConfig
    from lerobot_parallel.config import CompileConfig

    model_fn, cfg = act_policy(dropout=0.0)
    b = act_batch(cfg, batch_size)
    run = lambda m: m(b)
    variants = []
    for name, comp in (
        ("eager", CompileConfig()),
        ("regional", CompileConfig(enabled=True)),
        ("whole", CompileConfig(enabled=True, regional=False)),
    ):
        v = Variant(name, model_fn, run, AcceleratorConfig(compile=comp))
        t0 = time.perf_counter()
        v.step()  # the first step pays dynamo + inductor (forward and backward graphs)
        v.compile_s = time.perf_counter() - t0
        variants.append(v)
    interleave(variants, steps, warmup=2)
    base = variants[0]
    print(f"\nACT default size, batch {batch_size}, inductor on CPU ({torch.get_num_threads()} threads)")
    print(f"  {'variant':<10} {'first step s':>13} {'steps/s':>9} {'x eager':>8}")
    for v in variants:
        rate = 1 / median(v.times)
        print(f"  {v.name:<10} {v.compile_s:>13.1f} {rate:>9.2f} {rate * median(base.times):>8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--pi0-depth", type=int, default=12)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--skip-compile", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    act_fn, cfg = act_policy()
    batch = act_batch(cfg, args.batch_size)
    checkpointing_table(
        f"ACT default size (dim 512, 4+1 layers, 4 VAE layers, chunk 100), batch {args.batch_size}",
        act_fn,
        lambda m: m(batch),
        args.steps,
    )
    pi0_fn, pi0_run = pi0_case(args.pi0_depth, args.batch_size)
    checkpointing_table(
        f"pi0 tiny widths, {args.pi0_depth} joint layer pairs + {args.pi0_depth} SigLIP layers",
        pi0_fn,
        pi0_run,
        args.steps,
    )
    if not args.skip_compile:
        compile_table(args.steps, args.batch_size)


if __name__ == "__main__":
    main()

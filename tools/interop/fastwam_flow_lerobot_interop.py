"""FastWAM's flow matching equals LeRobot 0.6.1's bit for bit: schedule, training targets and both losses.

Two interpreters hand one safetensors file between them:

1. ours     (our env)      seeded inputs; our ``FlowSchedule`` timesteps, weights, noising and Euler grid;
                           ``draw_targets`` under a seed; ``video_loss`` / ``action_loss`` with and without
                           padding masks and the fused first frame, in float32 and bfloat16.
2. lerobot  (LeRobot env)  the same calls on LeRobot's ``WanContinuousFlowMatchScheduler`` and ``FastWAM``'s
                           own target and loss methods (called on a stand-in carrying only the schedulers),
                           compared with ``torch.equal``.

    uv run python tools/interop/fastwam_flow_lerobot_interop.py --lerobot-python <LeRobot env python>

Random draws: in float32 both sides draw from the same seed (torch's CPU generator gives the same stream
in LeRobot's torch 2.11 and our 2.15). In bfloat16 it does not: from 16 elements on, ``torch.randn`` in
bf16 takes a vectorised path whose numbers changed between those versions. So the bf16 cases record our draws
(``torch.randn_like`` / ``torch.rand``) and LeRobot's side replays them, which still checks what each draw
is used for, and in which order.

Exit status 0 means every comparison was exactly equal.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Self

# (num_train_timesteps, shift) of each case's video and action schedules.
SCHEDULES = [(1000, 5.0), (500, 3.0), (1000, 1.0)]
DTYPES = ["float32", "bfloat16"]


class Draws:
    """Records, or replays (``replay``), the ``torch.randn_like`` / ``torch.rand`` calls of a block."""

    def __init__(self, replay: list | None = None) -> None:
        import torch

        self.torch, self.replay, self.seen = torch, replay, []

    def __enter__(self) -> Self:
        torch = self.torch
        self.saved = torch.randn_like, torch.rand

        def wrap(name, real):
            def draw(*args, **kwargs):
                if self.replay is None:
                    value = real(*args, **kwargs)
                    self.seen.append(value)
                    return value
                value = self.replay.pop(0)
                reference = args[0] if name == "randn_like" else None
                if reference is not None:
                    assert value.shape == reference.shape and value.dtype == reference.dtype, name
                return value.clone()

            return draw

        torch.randn_like, torch.rand = wrap("randn_like", self.saved[0]), wrap("rand", self.saved[1])
        return self

    def __exit__(self, *exc) -> None:
        self.torch.randn_like, self.torch.rand = self.saved


def ours(path: Path) -> None:
    import torch
    from lerobot_cli.policies.fastwam.loss import action_loss, draw_targets, video_loss
    from lerobot_cli.policies.fastwam.schedule import FlowSchedule
    from safetensors.torch import save_file

    out: dict[str, torch.Tensor] = {}
    for i, (steps, shift) in enumerate(SCHEDULES):
        video, actions = FlowSchedule(steps, shift), FlowSchedule(steps, 5.0)
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            key = f"{i}.{dtype_name}"
            torch.manual_seed(100 + i)
            out[f"{key}.sample_t"] = video.sample_timesteps(13, "cpu", dtype)
            out[f"{key}.infer_t"], out[f"{key}.infer_d"] = video.inference_steps(10, "cpu", dtype)
            out[f"{key}.infer2_t"], out[f"{key}.infer2_d"] = video.inference_steps(4, "cpu", dtype, shift=2.0)
            t = (torch.rand(13) * steps).to(dtype)
            out[f"{key}.weight_in"], out[f"{key}.weight"] = t, video.weight(t)
            out[f"{key}.weight1"] = video.weight(t[:1])
            latents = torch.randn(3, 4, 3, 2, 2).to(dtype)  # [B, C, T, H, W]: 1 + 2 latent steps
            action = torch.randn(3, 8, 5).to(dtype)
            out[f"{key}.latents"], out[f"{key}.action"] = latents, action
            for fuse in (True, False):
                torch.manual_seed(7 + i)
                with Draws() as draws:
                    targets = draw_targets(latents, action, video, actions, fuse_first_frame=fuse)
                for n, value in enumerate(draws.seen):
                    out[f"{key}.fuse{int(fuse)}.draw{n}"] = value
                for field in (
                    "latents",
                    "target_video",
                    "timestep_video",
                    "noisy_action",
                    "target_action",
                    "timestep_action",
                ):
                    out[f"{key}.fuse{int(fuse)}.{field}"] = getattr(targets, field).contiguous()
                pred_video = torch.randn_like(latents)
                pred_action = torch.randn_like(action)
                image_is_pad = torch.zeros(3, 9, dtype=torch.bool)
                image_is_pad[1, 5:] = True
                image_is_pad[2, 2:] = True
                action_is_pad = torch.zeros(3, 8, dtype=torch.bool)
                action_is_pad[0, 6:] = True
                action_is_pad[2, :] = True
                out[f"{key}.fuse{int(fuse)}.pred_video"] = pred_video
                out[f"{key}.fuse{int(fuse)}.pred_action"] = pred_action
                out[f"{key}.image_is_pad"], out[f"{key}.action_is_pad"] = image_is_pad, action_is_pad
                tv, ta = targets.timestep_video, targets.timestep_action
                out[f"{key}.fuse{int(fuse)}.video_loss"] = video_loss(
                    pred_video, targets.target_video, tv, video, fuse
                )
                out[f"{key}.fuse{int(fuse)}.video_loss_pad"] = video_loss(
                    pred_video, targets.target_video, tv, video, fuse, image_is_pad=image_is_pad
                )
                out[f"{key}.fuse{int(fuse)}.action_loss"] = action_loss(
                    pred_action, targets.target_action, ta, actions
                )
                out[f"{key}.fuse{int(fuse)}.action_loss_pad"] = action_loss(
                    pred_action, targets.target_action, ta, actions, action_is_pad=action_is_pad
                )
    save_file(out, str(path))


def lerobot(path: Path) -> int:
    import functools
    from types import SimpleNamespace

    import torch
    from lerobot.policies.fastwam.wan.modular import FastWAM
    from lerobot.policies.fastwam.wan.video_dit import WanContinuousFlowMatchScheduler
    from safetensors.torch import load_file

    ref = load_file(str(path))
    checks, failures = 0, []

    def same(name: str, theirs: torch.Tensor) -> None:
        nonlocal checks
        checks += 1
        if not torch.equal(ref[name], theirs):
            failures.append(f"{name}: max|Δ| {(ref[name].double() - theirs.double()).abs().max().item():.3g}")

    for i, (steps, shift) in enumerate(SCHEDULES):
        video = WanContinuousFlowMatchScheduler(steps, shift)
        actions = WanContinuousFlowMatchScheduler(steps, 5.0)
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            key = f"{i}.{dtype_name}"
            torch.manual_seed(100 + i)
            same(f"{key}.sample_t", video.sample_training_t(13, "cpu", dtype))
            t, d = video.build_inference_schedule(10, "cpu", dtype)
            same(f"{key}.infer_t", t), same(f"{key}.infer_d", d)
            t, d = video.build_inference_schedule(4, "cpu", dtype, shift_override=2.0)
            same(f"{key}.infer2_t", t), same(f"{key}.infer2_d", d)
            same(f"{key}.weight", video.training_weight(ref[f"{key}.weight_in"]))
            same(f"{key}.weight1", video.training_weight(ref[f"{key}.weight_in"][:1]))
            latents, action = ref[f"{key}.latents"], ref[f"{key}.action"]
            for fuse in (True, False):
                stand_in = SimpleNamespace(
                    train_video_scheduler=video,
                    train_action_scheduler=actions,
                    device=torch.device("cpu"),
                    vae=SimpleNamespace(temporal_downsample_factor=4),
                )
                stand_in._compute_video_loss_per_sample = functools.partial(
                    FastWAM._compute_video_loss_per_sample, stand_in
                )
                inputs = {
                    "input_latents": latents,
                    "action": action,
                    "first_frame_latents": latents[:, :, 0:1] if fuse else None,
                    "image_is_pad": None,
                    "action_is_pad": None,
                }
                torch.manual_seed(7 + i)
                prefix = f"{key}.fuse{int(fuse)}.draw"
                replay = [ref[f"{prefix}{n}"] for n in range(4)] if dtype == torch.bfloat16 else None
                if replay is None:
                    targets = FastWAM._sample_training_targets(stand_in, inputs)
                else:
                    with Draws(replay):
                        targets = FastWAM._sample_training_targets(stand_in, inputs)
                    assert not replay, "LeRobot drew fewer numbers than we did"
                for field, theirs in (
                    ("latents", "latents"),
                    ("target_video", "target_video"),
                    ("timestep_video", "timestep_video"),
                    ("noisy_action", "noisy_action"),
                    ("target_action", "target_action"),
                    ("timestep_action", "timestep_action"),
                ):
                    same(f"{key}.fuse{int(fuse)}.{field}", targets[theirs])
                pred_video = ref[f"{key}.fuse{int(fuse)}.pred_video"]
                pred_action = ref[f"{key}.fuse{int(fuse)}.pred_action"]
                for pads, suffix in ((False, ""), (True, "_pad")):
                    inputs["image_is_pad"] = ref[f"{key}.image_is_pad"] if pads else None
                    inputs["action_is_pad"] = ref[f"{key}.action_is_pad"] if pads else None
                    same(
                        f"{key}.fuse{int(fuse)}.video_loss{suffix}",
                        FastWAM._compute_training_video_loss(
                            stand_in, inputs, pred_video, targets["target_video"], targets["timestep_video"]
                        ),
                    )
                    same(
                        f"{key}.fuse{int(fuse)}.action_loss{suffix}",
                        FastWAM._compute_training_action_loss(
                            stand_in,
                            inputs,
                            pred_action,
                            targets["target_action"],
                            targets["timestep_action"],
                        ),
                    )
    for line in failures:
        print("  differs:", line)
    print(json.dumps({"comparisons": checks, "differ": len(failures)}))
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lerobot-python", required=True)
    parser.add_argument("--side", choices=["lerobot"], help=argparse.SUPPRESS)
    parser.add_argument("--file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "lerobot":
        return lerobot(Path(args.file))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flow.safetensors"
        ours(path)
        done = subprocess.run(
            [
                args.lerobot_python,
                __file__,
                "--lerobot-python",
                args.lerobot_python,
                "--side",
                "lerobot",
                "--file",
                str(path),
            ],
            check=False,
            timeout=600,
        )
    print("fastwam flow interop:", "PASS (bit-equal)" if done.returncode == 0 else "FAILED")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

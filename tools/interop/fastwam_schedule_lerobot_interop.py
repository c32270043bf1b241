"""FastWAM's flow-matching schedule equals LeRobot 0.6.1's bit for bit.

Timesteps, weights, noising and the Euler grid are compared.

The schedule module needs only torch, numpy and attrs, so LeRobot's interpreter imports our file by path and
runs both schedulers on the same seeds side by side:

    uv run python tools/interop/fastwam_schedule_lerobot_interop.py --lerobot-python <LeRobot env python>

Exit status 0 means every comparison was exactly equal.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SCHEDULE = (
    Path(__file__).resolve().parents[2] / "packages/lerobot-cli/src/lerobot_cli/policies/fastwam/schedule.py"
)


def compare(schedule_path: str) -> None:
    """In LeRobot's environment: our ``FlowSchedule`` against ``WanContinuousFlowMatchScheduler``."""
    import importlib.util

    import torch
    from lerobot.policies.fastwam.wan.video_dit import WanContinuousFlowMatchScheduler

    spec = importlib.util.spec_from_file_location("fastwam_schedule", schedule_path)
    ours = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ours)
    checks = 0
    for steps, shift in [(1000, 5.0), (500, 3.0), (1000, 1.0), (1000, 7.5)]:
        a, b = ours.FlowSchedule(steps, shift), WanContinuousFlowMatchScheduler(steps, shift)
        for dtype in (torch.float32, torch.bfloat16):
            torch.manual_seed(steps + int(shift * 10))
            mine = a.sample_timesteps(13, "cpu", dtype)
            torch.manual_seed(steps + int(shift * 10))
            theirs = b.sample_training_t(13, "cpu", dtype)
            assert torch.equal(mine, theirs), (steps, shift, dtype, "timesteps")
            timesteps, deltas = a.inference_steps(10, "cpu", dtype)
            their_timesteps, their_deltas = b.build_inference_schedule(10, "cpu", dtype)
            assert torch.equal(timesteps, their_timesteps) and torch.equal(deltas, their_deltas), (
                steps,
                shift,
            )
            timesteps, deltas = a.inference_steps(4, "cpu", dtype, shift=2.0)
            their_timesteps, their_deltas = b.build_inference_schedule(4, "cpu", dtype, shift_override=2.0)
            assert torch.equal(timesteps, their_timesteps) and torch.equal(deltas, their_deltas), (
                steps,
                shift,
            )
            clean, noise = torch.randn(5, 3, 4).to(dtype), torch.randn(5, 3, 4).to(dtype)
            t = (torch.rand(5) * steps).to(dtype)
            assert torch.equal(a.noisy(clean, noise, t), b.add_noise(clean, noise, t)), (
                steps,
                shift,
                "noisy",
            )
            assert torch.equal(a.noisy(clean, noise, t[0]), b.add_noise(clean, noise, t[0]))
            assert torch.equal(a.euler(clean, deltas[1], noise), b.step(clean, their_deltas[1], noise))
            checks += 6
        t = torch.rand(17) * steps
        assert torch.equal(a.weight(t), b.training_weight(t)), (steps, shift, "weights")
        assert torch.equal(a.weight(t[:1]), b.training_weight(t[:1])), (steps, shift, "one weight")
        checks += 2
    print(f"fastwam schedule: {checks} comparisons bit-equal to LeRobot's WanContinuousFlowMatchScheduler")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lerobot-python", required=True)
    parser.add_argument("--compare", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compare:
        compare(args.compare)
        return 0
    done = subprocess.run(
        [args.lerobot_python, __file__, "--lerobot-python", args.lerobot_python, "--compare", str(SCHEDULE)],
        check=False,
        timeout=600,
    )
    print("fastwam schedule interop:", "PASS" if done.returncode == 0 else "FAILED")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())

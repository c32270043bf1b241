"""LeRobot 0.6.1's own ACTPolicy and LeRobotDataset, trained with this repository's libraries only.

lerobot-parallel plans and applies FSDP2 (LeRobot's ACT declares no wrap units, so the plan gets them),
lerobot-trainloop runs the steps (gradient accumulation, metrics reduced over ranks) and lerobot-ckpt
writes crash-safe checkpoints whose ``pretrained_model/`` LeRobot's ``ACTPolicy.from_pretrained`` loads.
Run it in LeRobot's environment (Python 3.12, torch 2.11) with the three libraries installed::

    torchrun --nproc-per-node=2 examples/lerobot_act_fsdp.py --output_dir=outputs/act_fsdp --steps=8
    torchrun --nproc-per-node=2 examples/lerobot_act_fsdp.py --output_dir=outputs/act_fsdp --steps=12

The second command resumes from the first one's last checkpoint (weights, optimizer, RNG, sampler,
accumulation window) and continues exactly. Each rank-0 log line is appended to ``losses.jsonl``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from lerobot.configs.types import FeatureType
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
from lerobot.utils.feature_utils import dataset_to_policy_features
from lerobot_ckpt import (
    Parallelism,
    RunInfo,
    TrainingObjects,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from lerobot_parallel import (
    AcceleratorConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    ParallelismConfig,
    build_plan,
    parallel_session,
    wrap_model,
)
from lerobot_trainloop import ShardedBatchSampler, TrainLoop, resumable_loader

REPO = Path(__file__).resolve().parents[1]
BATCH, ACCUM, CHUNK = 4, 2, 10


class Preprocessed:
    """The loader's batches through LeRobot's preprocessor (normalisation),
    re-iterable as TrainLoop needs."""

    def __init__(self, loader, preprocessor) -> None:
        self.loader, self.preprocessor = loader, preprocessor

    def __iter__(self):
        return (self.preprocessor(batch) for batch in self.loader)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--dataset_root", type=Path, default=REPO / "data" / "lerobot" / "demo_reach")
    args = parser.parse_args()
    args.output_dir.mkdir(parents=True, exist_ok=True)

    accel = AcceleratorConfig(
        gradient_accumulation=GradientAccumulationConfig(steps=ACCUM),
        fsdp=FSDPConfig(wrap_modules=("ACTEncoderLayer", "ACTDecoderLayer")),
    )
    with parallel_session(ParallelismConfig(dp_shard=-1), accel) as rt:
        meta_fps = LeRobotDataset("lerobot/demo_reach", root=args.dataset_root, video_backend="pyav").meta.fps
        dataset = LeRobotDataset(
            "lerobot/demo_reach",
            root=args.dataset_root,
            video_backend="pyav",
            delta_timestamps={"action": [i / meta_fps for i in range(CHUNK)]},
        )
        features = dataset_to_policy_features(dataset.meta.features)
        config = ACTConfig(
            input_features={k: f for k, f in features.items() if f.type is not FeatureType.ACTION},
            output_features={k: f for k, f in features.items() if f.type is FeatureType.ACTION},
            chunk_size=CHUNK,
            n_action_steps=CHUNK,
            dim_model=64,
            dim_feedforward=128,
            n_encoder_layers=2,
            n_decoder_layers=1,
            pretrained_backbone_weights=None,
            device="cpu",
        )
        torch.manual_seed(0)  # the same initial weights on every rank; FSDP2 shards them
        policy = ACTPolicy(config)
        preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=dataset.meta.stats)

        wrapped = wrap_model(policy, rt, build_plan(policy, rt, accel))
        optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=1e-4)
        sampler = ShardedBatchSampler(
            len(dataset), BATCH, dp_rank=rt.dp_rank, dp_world_size=rt.dp_world_size, seed=0
        )
        loop = TrainLoop(wrapped, optimizer, accelerator=accel, grad_clip_norm=10.0, sampler=sampler)
        objects = TrainingObjects(model=policy, optimizer=optimizer)
        if (last := latest_checkpoint(args.output_dir)) is not None:  # collective: every rank reads its part
            state = load_checkpoint(last, objects=objects)
            sampler.load_state_dict(state.sampler_state)
            loop.load_state_dict(state.loop_state)

        def log(event) -> None:
            if rt.is_main:
                with open(args.output_dir / "losses.jsonl", "a") as f:
                    f.write(json.dumps({"step": event.step, "loss": event.metrics["loss"]}) + "\n")

        def write_pretrained(directory: Path) -> None:  # LeRobot's own files beside the gathered weights
            config.save_pretrained(directory)
            preprocessor.save_pretrained(directory)
            postprocessor.save_pretrained(directory)

        run = RunInfo(
            world_size=rt.world_size,
            batch_size=BATCH,
            grad_accum_steps=ACCUM,
            parallelism=Parallelism(rt.parallelism.dp_replicate, rt.parallelism.dp_shard),
        )

        def save(event) -> None:  # collective: every rank calls it; the weights are gathered to rank 0
            save_checkpoint(
                args.output_dir,
                event.step,
                run=run,
                objects=objects,
                sampler_state=sampler.state_dict(),
                loop_state=event.loop.state_dict(),
                write_pretrained=write_pretrained,
            )

        loop.add_hook(log, every=1, metrics=True)
        loop.add_hook(save, every=4)
        loader = resumable_loader(dataset, sampler, seed=rt.rank, num_workers=0)  # its own RNG
        loop.run(Preprocessed(loader, preprocessor), num_steps=args.steps)  # counts the resumed steps
        if rt.is_main:
            print(
                f"{rt.describe()} | trained to step {loop.step}, last checkpoint "
                f"{latest_checkpoint(args.output_dir).name}"
            )


if __name__ == "__main__":
    main()

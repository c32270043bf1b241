"""Run under ``torchrun --nproc-per-node=2``: rank 1 raises mid-training while rank 0 waits in
DDP's gradient all-reduce. The job must end non-zero, quickly, naming rank 1 and its error."""

from __future__ import annotations

import sys
import time

from _common import arm_watchdog

arm_watchdog(120)  # the test demands far less; this only bounds a broken teardown

import torch
from lerobot_parallel import build_plan, parallel_session, wrap_model
from lerobot_trainloop import ShardedBatchSampler, TrainLoop
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor

FAIL_AT = 3


class FailingOnRank1(TinyRegressor):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank, self.calls = rank, 0

    def forward(self, batch):
        self.calls += 1
        if self.rank == 1 and self.calls == FAIL_AT:
            print(f"FAILING_AT_UNIX={time.time():.3f}", file=sys.stderr, flush=True)
            raise ValueError(f"deliberate failure in forward at loop step {FAIL_AT}")
        return super().forward(batch)


def main() -> None:
    with parallel_session(device="cpu") as rt:
        ds = SyntheticRegression(64)
        sampler = ShardedBatchSampler(len(ds), 4, dp_rank=rt.dp_rank, dp_world_size=rt.dp_world_size)
        model = FailingOnRank1(rt.rank)
        wrapped = wrap_model(model, rt, build_plan(model, rt))
        loop = TrainLoop(wrapped, torch.optim.SGD(model.parameters(), lr=0.01), sampler=sampler)
        loop.run((ds.batch(ix) for ix in sampler), 1000)
    print("UNREACHABLE: training finished", file=sys.stderr)


if __name__ == "__main__":
    main()

"""Batch placement has one rule for per-sample host values (``batch.HOST_KEYS``: the dataset ``index``):
the loop's placement, in training and in the held-out eval, never moves them to the device, because the
policies that read them (pi0, diffusion, FastWAM: ``index.tolist()``) would then read a device copy back,
a blocking sync every step on an accelerator.

A CPU run cannot see a device copy, so the checks either place on the ``meta`` device (where the moved
tensors really change device) or record the ``Tensor.to`` calls that would copy on an accelerator
(``testing.UploadRecorder``). The CLI's pre-processor + loop path: packages/lerobot-cli/tests/
test_train_placement.py."""

from __future__ import annotations

from collections import OrderedDict

import torch
from lerobot_parallel.plan import build_plan
from lerobot_parallel.runtime import ParallelRuntime
from lerobot_parallel.wrap import wrap_model
from lerobot_trainloop import TrainLoop
from lerobot_trainloop.batch import HOST_KEYS, move_to_device
from lerobot_trainloop.evaluation import evaluate
from lerobot_trainloop.testing import SyntheticRegression, TinyRegressor, UploadRecorder

RT = ParallelRuntime.single("cpu")
META = torch.device("meta")


def test_host_keys_stay_on_the_host_at_any_depth():
    assert "index" in HOST_KEYS
    index = torch.arange(4)
    batch = {"x": torch.zeros(4, 2), "index": index, "nested": OrderedDict(index=index, y=torch.ones(4))}
    moved = move_to_device(batch, META)
    assert moved["x"].device == META and moved["nested"]["y"].device == META
    assert moved["index"] is index and moved["nested"]["index"] is index  # not even copied on the host
    assert type(moved["nested"]) is OrderedDict
    # the set is a parameter: a caller with other host values names them, an empty set moves everything
    assert move_to_device(batch, META, frozenset())["index"].device == META
    assert move_to_device(batch, META, frozenset({"x"}))["x"].device.type == "cpu"


class _IndexReader(TinyRegressor):
    """The TinyRegressor, plus what pi0/diffusion/FastWAM do with ``index``: note the object it got."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.Tensor] = []

    def forward(self, batch):
        self.seen.append(batch["index"])
        batch["index"].reshape(-1).tolist()  # the per-sample seeds, read on the host
        return super().forward(batch)


def test_the_loop_uploads_the_batch_but_never_its_index():
    ds = SyntheticRegression(16)
    model = _IndexReader()
    loop = TrainLoop(
        wrap_model(model, RT, build_plan(model, RT)), torch.optim.SGD(model.parameters(), lr=0.1)
    )
    batches = [ds.batch([4 * s + i for i in range(4)]) for s in range(3)]
    with UploadRecorder(label=lambda: loop.step) as rec:
        for batch in batches:
            loop.train_step(batch)
    assert len(model.seen) == 3
    for step, (batch, seen) in enumerate(zip(batches, model.seen, strict=True)):
        assert seen is batch["index"]  # the model reads the host tensor the collate made
        assert rec.uploads_of(batch["x"], step) == 1  # the recorder sees the loop's placement on CPU
        assert rec.uploads_of(batch["index"], step) == 0, f"step {step + 1} uploaded the index"

    with UploadRecorder() as rec:
        evaluate(loop, batches[:2], [4, 4])
    assert [rec.uploads_of(b["index"]) for b in batches[:2]] == [0, 0]
    assert [rec.uploads_of(b["x"]) for b in batches[:2]] == [1, 1]


def test_the_recorder_sees_an_upload_and_ignores_the_rest():
    t = torch.zeros(2)
    with UploadRecorder(label=lambda: "here") as rec:
        t.to(torch.device("cpu"))  # the run's device (a CPU run's): an upload on an accelerator
        t.to(META)
        t.to(device=torch.device("cpu"), non_blocking=True)
        t.to(torch.float64)  # a cast
        t.to("cpu")  # the host, named
        t.to(META).to(META)  # one upload: the second call is not from the host
    assert rec.uploads_of(t, "here") == 4 and rec.uploads_of(t, "elsewhere") == 0
    assert "to" not in vars(torch.Tensor) and "cuda" not in vars(torch.Tensor)  # undone

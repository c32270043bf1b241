"""FastWAM inference on FSDP2 x2 (gloo, CPU) gives one process's actions, bit for bit.

``predict_action_chunk`` and ``select_action`` are methods of the policy, the FSDP root, not its ``forward``:
lerobot-parallel registers them with ``register_fsdp_forward_method`` (``sharding.ROOT_FORWARD_METHODS``) so
they gather the root's own parameters (the proprio encoder, the experts' embeddings and heads) as ``forward``
does; the ``MoTLayer`` units gather in their own forward, which every prefill and cached action pass calls.

One launch (``multiproc/fastwam_inference.py``, ~18 s; the file ~26 s on 2 CPU cores): each rank plans the
tiny FastWAM as lerobot-train does, feeds its own observations and reports the chunk right after wrapping,
after a training forward and backward (which reshards the root), and what ``select_action`` pops; here the
same weights (``multiproc/fastwam_tiny.py``: a seeded build) run unsharded on one process. Bit-equal, not
close: the parameters are float32 and all-gathering them copies shards without arithmetic, so each rank runs
the very same float32 ops on the same tensors with one thread (as torchrun's ranks, OMP_NUM_THREADS=1), and
the noise comes from ``torch.Generator(rand_device).manual_seed(inference_seed)``. Under bf16 mixed
precision the gathered weights would be rounded and only a tolerance could hold.

Not covered, by design: ranks must run the same number of samples and Euler steps (each sample's prefill and
every step all-gather each unit): a rank with a smaller batch would leave its peer waiting in a collective.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
MULTIPROC = Path(__file__).resolve().parent / "multiproc"
SELECT_CALLS, RANKS = 4, 2


@pytest.fixture(scope="module")
def ranks(launch, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fastwam_inference")
    job = launch.torchrun(MULTIPROC / "fastwam_inference.py", str(out), nproc=RANKS, timeout_s=150)
    assert job.returncode == 0 and not job.timed_out, job.describe()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.fixture(scope="module")
def reference() -> list[dict]:
    """The same weights on one process, unsharded: each rank's batch's chunk and ``select_action`` pops."""
    sys.path.insert(0, str(MULTIPROC))
    from fastwam_tiny import live_batch, tiny_fastwam

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's ranks: the same reduction order in matmuls
    try:
        policy = tiny_fastwam()
        out = []
        for r in range(RANKS):
            batch = live_batch(10 + r)
            chunk = policy.predict_action_chunk(batch).tolist()
            policy.reset()
            out.append(
                {
                    "chunk": chunk,
                    "select": [policy.select_action(batch).tolist() for _ in range(SELECT_CALLS)],
                }
            )
        return out
    finally:
        torch.set_num_threads(threads)


def test_the_root_registers_lerobots_inference_methods(ranks):
    for res in ranks:
        assert res["units"] == ["model.mot.layers.0", "model.mot.layers.1"]
        assert res["all_sharded"]
        # the MoTLayer units run through forward only: nothing to register on them
        assert res["registered"] == {"": ["predict_action_chunk"]}


def test_sharded_action_chunks_equal_one_process_bit_for_bit(ranks, reference):
    assert ranks[0]["fresh"] != ranks[1]["fresh"]  # each rank ran its own observations
    for res, ref in zip(ranks, reference, strict=True):
        assert res["fresh"] == ref["chunk"]
        # after backward FSDP reshards the root too: inference gathers it again
        assert res["root_sharded_after_backward"]
        assert res["after_train"] == ref["chunk"]
        # units are shards again after each pass; the root stays gathered after a forward (torch's default)
        assert res["layers_resharded"] and res["layers_resharded_after_select"]
        assert not res["root_sharded_after_inference"]


def test_select_action_pops_the_sharded_chunks_actions(ranks, reference):
    for res, ref in zip(ranks, reference, strict=True):
        assert len(res["select_action"]) == SELECT_CALLS
        assert res["select_action"] == ref["select"]
        # n_action_steps=3: three pops from the first chunk, then a refill (same seed: its first action again)
        steps = [[row[t] for row in ref["chunk"]] for t in range(3)]
        assert res["select_action"] == [*steps, steps[0]]
        # the refill went through the registered predict_action_chunk alone: the root stays gathered
        assert res["root_sharded_after_select"] is False

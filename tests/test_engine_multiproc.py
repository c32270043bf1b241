"""Real 2-process torchrun jobs on CPU/gloo against single-process references.

One launch (``multiproc/engine_checks.py``) runs every check that can share a job; its ranks
write what they saw, and each test below compares one aspect with a reference computed here,
in this process, as a genuine single-process run of the same code (``multiproc/_workload.py``).
A second launch checks that a failing rank ends the job promptly and is named.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from lerobot_parallel.runtime import ParallelRuntime

pytestmark = pytest.mark.slow
MULTIPROC = Path(__file__).resolve().parent / "multiproc"


def _workload():
    if "lerobot_tests_workload" not in sys.modules:
        spec = importlib.util.spec_from_file_location("lerobot_tests_workload", MULTIPROC / "_workload.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["lerobot_tests_workload"]


def _regions_checks():
    """multiproc/regions_checks.py, for its ``assert_applied`` (what a checkpointed layout must show)."""
    if "lerobot_tests_regions_checks" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "lerobot_tests_regions_checks", MULTIPROC / "regions_checks.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["lerobot_tests_regions_checks"]


@pytest.fixture(scope="module")
def ranks(launch, tmp_path_factory):
    out = tmp_path_factory.mktemp("engine")
    job = launch.torchrun(MULTIPROC / "engine_checks.py", str(out), nproc=2, timeout_s=150)
    assert job.returncode == 0 and not job.timed_out, job.describe()
    assert "Signal 6" not in job.output and "SIGABRT" not in job.output, job.describe()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def single():
    return ParallelRuntime.single("cpu")


def test_runtime_facts(ranks):
    for r, res in enumerate(ranks):
        rt = res["runtime"]
        assert (rt["rank"], rt["world_size"], rt["local_rank"], rt["dp_rank"], rt["dp_world_size"]) == (
            r,
            2,
            r,
            r,
            2,
        )
        assert (rt["backend"], rt["device"], rt["mode"], rt["launcher"]) == ("gloo", "cpu", "ddp", "torchrun")
        assert rt["mesh_dim_names"] == ["dp_replicate"] and rt["mesh_shape"] == [2]
        assert rt["is_main"] is (r == 0) and rt["owns_process_group"] is True


def test_ddp_two_processes_match_one_process_on_the_same_global_batch(ranks, single):
    """2 x B=4 DDP vs 1 x B=8: reduced losses within 1e-5 for 4 steps, same final weights."""
    ref = _workload().train(single, batch_size=8, grad_accum=1, steps=4)
    for res in ranks:
        ddp = res["ddp_k1"]
        assert len(ddp["losses"]) == 4
        for a, b in zip(ddp["losses"], ref["losses"], strict=True):
            assert abs(a - b) < 1e-5, (ddp["losses"], ref["losses"])
        assert max(abs(a - b) for a, b in zip(ddp["params"], ref["params"], strict=True)) < 1e-5
        assert all(ddp["params_same_each_step"])
        assert ddp["sampler"] == {**ref["sampler"], "batch_size": 4, "dp_world_size": 2}
    assert ref["losses"][0] != ref["losses"][-1]  # it actually trained


def test_grad_accumulation_two_processes_match_one_big_batch(ranks, single):
    """2 procs x B=2 x K=2 (6 loop steps) vs 1 proc x B=8 x K=1 (3 loop steps)."""
    ref = _workload().train(single, batch_size=8, grad_accum=1, steps=3)
    for res in ranks:
        acc = res["ddp_k2"]
        assert acc["optimizer_steps"] == 3
        assert max(abs(a - b) for a, b in zip(acc["params"], ref["params"], strict=True)) < 1e-5
        for j, big in enumerate(ref["losses"]):  # weights are fixed inside a window
            assert abs((acc["losses"][2 * j] + acc["losses"][2 * j + 1]) / 2 - big) < 1e-5


def test_no_sync_on_non_final_micro_batches(ranks):
    for res in ranks:
        probe = res["ddp_k2"]["probe"]
        assert [p["synced"] for p in probe] == [False, True] * 3
        assert all(p["model_type"] == "DistributedDataParallel" for p in probe)
        # local gradients differ between ranks until the sync step all-reduces them
        assert all(p["grads_same"] is False for p in probe if not p["synced"])
        assert all(p["params_same"] for p in probe)


def test_bf16_and_fp16_under_ddp(ranks):
    for res in ranks:
        bf16 = res["bf16"]
        assert bf16["param_dtypes"] == ["torch.float32"] and all(bf16["params_same_each_step"])
        # fp32 master weights, bf16 compute: autocast is really on under DDP (and off without it)
        assert bf16["linear_output_dtypes"] == ["torch.bfloat16"]
        assert res["ddp_k1"]["linear_output_dtypes"] == ["torch.float32"]
        assert all(math.isfinite(x) for x in bf16["losses"])
        fp16 = res["fp16"]
        assert [o["skipped"] for o in fp16["outputs"]] == [True, False, False]
        assert fp16["skipped_updates"] == 1 and fp16["optimizer_steps"] == 2
        assert [o["lr"] for o in fp16["outputs"]] == pytest.approx([0.05, 0.045, 0.0405])


def test_sampler_ranks_disjoint_and_covering_through_dataloader_workers(ranks):
    """10 steps x 2 ranks x 3 = 60 samples = 3 epochs of 20: per epoch, every sample once."""
    per_rank = [res["sampler"]["batches"] for res in ranks]
    stream = [i for k in range(10) for r in range(2) for i in per_rank[r][k]]
    for e in range(3):
        epoch = stream[20 * e : 20 * (e + 1)]
        assert sorted(epoch) == list(range(20)), f"epoch {e}: {epoch}"
    for k in range(10):
        start, end = 6 * k, 6 * k + 5
        if start // 20 == end // 20:
            assert not set(per_rank[0][k]) & set(per_rank[1][k])
    states = [res["sampler"]["state"] for res in ranks]
    assert states[0] == states[1] and (states[0]["epoch"], states[0]["offset"]) == (3, 0)


def test_metric_reduction_rank_dependent_values_one_collective(ranks):
    for res in ranks:
        reduced, calls = res["metrics"]["reduced"], res["metrics"]["collectives"]
        assert calls == 1
        assert reduced["loss"] == pytest.approx(2.5)  # mean of window means 2 and 3
        assert reduced["step_s"] == pytest.approx(0.2)  # max of 0.1, 0.2
        assert reduced["data_s"] == pytest.approx(0.5)  # max of 0.5, 0.4
        assert reduced["samples"] == 12  # sum of 4, 8
        assert reduced["low"] == 9.0  # min of 10, 9
        assert reduced["only_rank0"] == 42.0  # NaN on rank 1 is ignored, not averaged in
    assert ranks[0]["metrics"]["reduced"]["lr"] == pytest.approx(0.001)  # local: not reduced
    assert ranks[1]["metrics"]["reduced"]["lr"] == pytest.approx(0.002)


def test_a_failing_rank_ends_the_job_and_is_named(launch):
    job = launch.torchrun(MULTIPROC / "rank_failure.py", nproc=2, timeout_s=90)
    assert not job.timed_out, job.describe()
    assert job.returncode != 0
    assert "[rank 1/2] failed with ValueError: deliberate failure in forward at loop step 3" in job.output
    assert "UNREACHABLE" not in job.output
    # torchrun's summary names the root cause too
    root = job.output[job.output.index("Root Cause") :]
    assert "rank      : 1" in root
    failed_at = float(job.output.split("FAILING_AT_UNIX=")[1].split()[0])
    latency = job.ended_at - failed_at
    print(f"failing rank raised -> job ended in {latency:.1f} s (job total {job.elapsed_s:.1f} s)")
    assert latency < 60, job.describe()  # from the raise to the whole job's end


def test_activation_checkpointing_under_ddp(ranks):
    """Full and selective checkpointing under DDP: applied (each block recomputed in backward, fewer bytes
    saved for it), and DDP's averaged gradients equal the plain DDP run's bitwise (the recomputation
    repeats the same ops on the same values)."""
    for res in ranks:
        for case in ("blocks", "joint"):
            got = res["regions"][case]
            assert got["grad_abs_max"] > 1e-3 and got["full"] == 0 and got["selective"] == 0, (case, got)
            _regions_checks().assert_applied(case, got, sharded=False)


def test_ddp_steps_make_no_blocking_read_or_collective_between_log_steps(ranks):
    """Per loop step, besides DDP's gradient all-reduce (its C++ reducer): nothing blocking on a
    non-log step, only the interrupt flag's async all-reduce; the log step reads once after one
    all-gather; a signal on rank 1 during step 14 stops both ranks after step 16 (agreed at 15, the
    end of its K=2 window at 16)."""
    for res in ranks:
        got = res["ddp_syncs"]
        blocking = {int(s): v for s, v in got["blocking"].items()}
        assert got["model_type"] == "DistributedDataParallel"
        assert got["stopped"] == {"step": 16, "signal": 15}, got["stopped"]
        assert all(blocking[s] == [] for s in range(1, 17) if s != 12), blocking
        assert blocking[12] == ["all_gather_into_tensor", "tolist"], blocking[
            12
        ]  # the counter sees a log step
        assert all(got["async"][str(s)] == ["all_reduce"] for s in range(1, 15)), got["async"]
        assert got["async"]["15"] == [] and len(got["logged"]) == 1


def test_a_nan_on_one_rank_stops_every_rank_naming_it(ranks):
    for res in ranks:
        nan = res["nan_rank1"]
        assert nan["step"] == 4, nan
        assert nan["error"].startswith("rank 1: loss is nan at loop step 3 (read at loop step 4"), nan

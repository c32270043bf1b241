"""FSDP2 (2 processes) and HSDP (2 x 2, 4 processes) on CPU/gloo against single-process references.

Two launches in all: ``multiproc/fsdp_checks.py`` and ``multiproc/fsdp_hsdp_checks.py`` run every
check that can share a job; their ranks write what they saw, and each test below compares one
aspect with a reference computed here, in this process, as a genuine single-process run of the
same code (``multiproc/fsdp_workload.py``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from lerobot_parallel.runtime import ParallelRuntime

pytestmark = pytest.mark.slow
MULTIPROC = Path(__file__).resolve().parent / "multiproc"
TOL = 1e-5
FP16_TOL = 2e-3  # fp16 autocast on another batch split: the same updates, rounded differently


def _workload():
    name = "lerobot_tests_fsdp_workload"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MULTIPROC / "fsdp_workload.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _regions_checks():
    """multiproc/regions_checks.py, for its ``assert_applied`` (what a checkpointed layout must show)."""
    name = "lerobot_tests_regions_checks"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, MULTIPROC / "regions_checks.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _launch(launch, tmp_path_factory, script: str, nproc: int) -> list[dict]:
    out = tmp_path_factory.mktemp(script.removesuffix(".py"))
    job = launch.torchrun(MULTIPROC / script, str(out), nproc=nproc, timeout_s=180)
    assert job.returncode == 0 and not job.timed_out, job.describe()
    assert "Signal 6" not in job.output and "SIGABRT" not in job.output, job.describe()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.fixture(scope="module")
def fsdp(launch, tmp_path_factory):
    return _launch(launch, tmp_path_factory, "fsdp_checks.py", 2)


@pytest.fixture(scope="module")
def hsdp(launch, tmp_path_factory):
    return _launch(launch, tmp_path_factory, "fsdp_hsdp_checks.py", 4)


@pytest.fixture(scope="module")
def ref():
    """Single-process runs on the global batch of 8 (computed lazily, once each)."""
    single = ParallelRuntime.single("cpu")
    cache: dict = {}

    def get(key: str, **kwargs):
        if key not in cache:
            cache[key] = _workload().json_ready(_workload().train(single, **kwargs))
        return cache[key]

    return get


def close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < tol


def expected_local_numels(shape: list[int], shards: int) -> list[int]:
    """What each shard rank holds: ``torch.chunk`` of dim 0 (the last ranks get less, or nothing)."""
    rows = [c.shape[0] for c in torch.empty(shape[0] if shape else 1).chunk(shards)]
    rows += [0] * (shards - len(rows))
    per_row = math.prod(shape[1:]) if shape else 1
    return [r * per_row for r in rows]


# ---- FSDP2, 2 processes --------------------------------------------------------------------


def test_fsdp_runtime_and_refusals(fsdp):
    for r, res in enumerate(fsdp):
        assert res["runtime"] == {
            "mode": "fsdp",
            "mesh_dim_names": ["dp_shard"],
            "mesh_shape": [2],
            "dp_rank": r,
            "dp_world_size": 2,
        }
        no_units = res["no_units"]
        for way in ("accelerator.fsdp.wrap_modules", "accelerator.fsdp.min_num_params", "_fsdp_wrap_modules"):
            assert way in no_units
        assert "Block x3" in no_units  # the class names a user can pick from
        tied = res["tied"]
        assert "embed.weight" in tied and "head.proj.weight" in tied
        assert "unit head (TokenHead)" in tied and "root" in tied


def test_grouped_joint_units_give_bitwise_equal_gradients(fsdp):
    """Towers whose i-th layers run jointly (pi0's shape): one fully_shard per layer pair, the joint
    method registered as the unit's forward; same names, every parameter sharded, gradients bitwise."""
    from lerobot_parallel.testing import JointTowers

    model = JointTowers()
    loss, _ = model(JointTowers.batch(4, seed=3))
    loss.backward()
    for res in fsdp:
        joint = res["joint"]
        assert joint["units"] == ["main.0 + side.0", "main.1 + side.1"]
        # Naming only one member still shards the pair together (the naive wrap would never gather it).
        assert joint["naive_units"] == ["main.0 + side.0", "main.1 + side.1"]
        assert joint["loss"] == float(loss)
        assert set(joint["grads"]) == {n for n, _ in model.named_parameters()}
        for name, p in model.named_parameters():
            assert joint["grads"][name] == p.grad.flatten().tolist(), name
        for name, fact in joint["shards"].items():
            assert fact["type"] == "DTensor", name
            assert fact["all_local_numel"] == expected_local_numels(fact["full"], 2), name


def test_pi0_joint_layers_shard_in_pairs_with_bitwise_gradients(fsdp):
    sys.path.insert(0, str(MULTIPROC))
    from pi0_tiny import pi0_batch, tiny_pi0

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as torchrun's ranks (OMP_NUM_THREADS=1): the same reduction order in matmuls
    try:
        policy = tiny_pi0()
        loss, _ = policy(*pi0_batch())
        loss.backward()
    finally:
        torch.set_num_threads(threads)
    expected = {n: p.grad.flatten().tolist() for n, p in policy.named_parameters() if p.grad is not None}
    for res in fsdp:
        pi0 = res["pi0"]
        assert pi0["grouped"] == [
            f"model.paligemma_with_expert.paligemma.model.language_model.layers.{i} + "
            f"model.paligemma_with_expert.gemma_expert.model.layers.{i}"
            for i in range(2)
        ]
        assert pi0["loss"] == float(loss)
        assert pi0["checkpointed_loss"] == pi0["loss"] and pi0["checkpointed_grad_diff"] == 0
        # each (PaliGemma layer i, expert layer i) pair runs once in forward; checkpointed, once more in
        # backward, with both layers' shards gathered again by FSDP (they were shards after forward)
        layers = len(pi0["grouped"])
        assert pi0["calls"] == {
            "forward_calls": layers,
            "backward_calls": 0,
            "backward_gathered": 0,
            "resharded_before_backward": True,
        }, pi0["calls"]
        assert pi0["checkpointed_calls"] == {
            "forward_calls": layers,
            "backward_calls": layers,
            "backward_gathered": layers,
            "resharded_before_backward": True,
        }
        assert pi0["grads"].keys() == expected.keys()
        differ = {
            n: max(abs(a - b) for a, b in zip(pi0["grads"][n], g, strict=True))
            for n, g in expected.items()
            if pi0["grads"][n] != g
        }
        assert not differ, sorted(differ)
        for name, fact in pi0["shards"].items():
            assert fact["type"] == "DTensor", name
            assert fact["all_local_numel"] == expected_local_numels(fact["full"], 2), name


def test_fsdp2_two_processes_match_one_process_on_the_same_global_batch(fsdp, ref):
    single = ref("fp32", batch_size=8, steps=4)
    assert single["losses"][0] != single["losses"][-1]  # it trains
    for res in fsdp:
        run = res["fp32"]
        assert close(run["losses"], single["losses"]), (run["losses"], single["losses"])
        assert close(run["params"], single["params"])
        assert run["param_types"] == ["DTensor"] and run["param_dtypes"] == ["torch.float32"]


def test_every_parameter_is_sharded_over_dp_shard(fsdp):
    shards = fsdp[0]["fp32"]["shards"]
    assert len(shards) == 18
    uneven = 0
    for name, f in shards.items():
        assert f["type"] == "DTensor" and f["placements"] == ["S(0)"], name
        expected = expected_local_numels(f["full"], 2)
        assert f["all_local_numel"] == expected, (name, f)
        assert sum(f["all_local_numel"]) == math.prod(f["full"])
        uneven += f["full"][0] % 2
    assert uneven > 0  # odd dim-0 sizes were exercised (padding)
    for r, res in enumerate(fsdp):
        for name, f in res["fp32"]["shards"].items():
            assert math.prod(f["local"]) == f["all_local_numel"][r]


def test_gradient_accumulation_under_fsdp2_matches_one_big_batch(fsdp, ref):
    """2 procs x B=2 x K=2 (6 loop steps) vs 1 proc x B=8 (3 steps);
    no reduce-scatter before the window ends."""
    big = ref("fp32_3", batch_size=8, steps=3)
    for res in fsdp:
        acc = res["accum"]
        assert acc["optimizer_steps"] == 3
        assert close(acc["params"], big["params"])
        for j, loss in enumerate(big["losses"]):
            assert abs((acc["losses"][2 * j] + acc["losses"][2 * j + 1]) / 2 - loss) < TOL
        steps = acc["per_step"]
        assert [s["synced"] for s in steps] == [False, True] * 3
        assert all(s["reduce_scatters"] == 0 for s in steps if not s["synced"])
        assert all(s["reduce_scatters"] == 4 for s in steps if s["synced"])  # 3 blocks + root


def test_clipping_over_sharded_gradients(fsdp, ref):
    single = ref("clip", batch_size=8, steps=3, grad_clip_norm=0.05)
    norms = [o["grad_norm"] for o in single["outputs"]]
    assert all(n > 0.05 for n in norms)  # clipping was active
    for res in fsdp:
        run = res["clip"]
        got = [o["grad_norm"] for o in run["outputs"]]
        assert all(isinstance(n, float) for n in got)
        assert close(got, norms)
        assert close(run["params"], single["params"])


def test_ignored_modules_stay_unsharded_and_in_step(fsdp, ref):
    single = ref("clip", batch_size=8, steps=3, grad_clip_norm=0.05)
    for res in fsdp:
        run = res["ignored"]
        assert set(run["head_types"].values()) == {"Parameter"}
        assert run["param_types"] == ["DTensor", "Parameter"]
        assert all(run["head_same_each_step"])  # gradients averaged: replicas did not drift
        assert close(run["losses"], single["losses"])
        assert close([o["grad_norm"] for o in run["outputs"]], [o["grad_norm"] for o in single["outputs"]])
        assert close(run["params"], single["params"])


def test_min_num_params_units_and_no_reshard(fsdp, ref):
    single = ref("fp32_3", batch_size=8, steps=3)
    for res in fsdp:
        assert res["min_params_units"] == [f"blocks.{i}.{fc}" for i in range(3) for fc in ("fc1", "fc2")]
        assert close(res["min_params"]["losses"], single["losses"])
        assert close(res["min_params"]["params"], single["params"])


def test_bf16_derived_policy(fsdp, ref):
    fp32 = ref("fp32_3", batch_size=8, steps=3)
    for res in fsdp:
        run = res["bf16"]
        assert run["param_dtypes"] == ["torch.float32"]  # sharded fp32 masters
        probe = run["probe"]
        assert probe["block_param"] == "torch.bfloat16" and probe["block_input"] == "torch.bfloat16"
        assert (
            probe["root_input"] == "torch.float32" and probe["target"] == "torch.float32"
        )  # root does not cast
        assert run["reduce_dtypes"] == ["torch.float32"]
        assert all(math.isfinite(x) for x in run["losses"])
        assert run["losses"] != fp32["losses"]
        assert close(run["losses"], fp32["losses"], tol=0.05 * max(fp32["losses"]))


def test_each_mixed_precision_policy_rule(fsdp):
    for res in fsdp:
        only = res[
            "mpp_param_only"
        ]  # mixed_precision=no: no autocast; torch 2.15 reduces in the params' dtype
        assert only["reduce_dtypes"] == ["torch.float32"]
        assert only["probe"]["root_input"] == "torch.bfloat16"  # cast_forward_inputs defaults to True
        assert only["probe"]["block_param"] == "torch.bfloat16" and only["param_dtypes"] == ["torch.float32"]
        assert res["mpp_reduce_bf16"]["reduce_dtypes"] == ["torch.bfloat16"]
        assert res["mpp_no_cast"]["probe"]["root_input"] == "torch.float32"
        out = res["mpp_output_fp32"]["probe"]
        assert out["block_output"] == "torch.bfloat16" and out["after_blocks"] == "torch.float32"
        for key in ("mpp_param_only", "mpp_reduce_bf16", "mpp_no_cast", "mpp_output_fp32"):
            assert all(math.isfinite(x) for x in res[key]["losses"]), key


def test_fp16_loss_scaler_with_sharded_gradients(fsdp, ref):
    for res in fsdp:
        run = res["fp16"]
        assert run["probe"]["block_param"] == "torch.float16" and run["param_dtypes"] == ["torch.float32"]
        assert [o["skipped"] for o in run["outputs"]] == [True, False, False]  # same on both ranks
        assert run["skipped_updates"] == 1 and run["optimizer_steps"] == 2
        assert [o["lr"] for o in run["outputs"]] == pytest.approx([0.05, 0.045, 0.0405])
        assert all(math.isfinite(x) for x in run["losses"])
    # Gathered full parameters are equal on every rank by construction; what shows that no rank applied
    # the skipped update to its own shard is the match with one process that skipped it too.
    skipped = ref(
        "fp16_skip1",
        batch_size=8,
        steps=3,
        mixed_precision="fp16",
        scheduler=True,
        init_scale=2.0**40,
        backoff_factor=2.0**-32,
    )
    assert close(fsdp[0]["fp16"]["params"], skipped["params"], tol=FP16_TOL)


def test_fp16_overflow_in_one_rank_shard_is_skipped_by_every_rank(fsdp, ref):
    """Only rank 0's gradient shard holds the inf, so a rank deciding alone would step: every rank must
    skip step 1 (the inf flag is reduced over the mesh), and the parameters match one process that
    skipped step 1 — not one that applied it, which lies measurably further away."""
    skipped = ref(
        "fp16_skip1",
        batch_size=8,
        steps=3,
        mixed_precision="fp16",
        scheduler=True,
        init_scale=2.0**40,
        backoff_factor=2.0**-32,
    )
    applied = ref(
        "fp16_no_skip", batch_size=8, steps=3, mixed_precision="fp16", scheduler=True, init_scale=2.0**8
    )
    assert max(abs(a - b) for a, b in zip(skipped["params"], applied["params"], strict=True)) > 10 * FP16_TOL
    for res in fsdp:
        run = res["fp16_one_shard"]
        assert [o["skipped"] for o in run["outputs"]] == [True, False, False]
        assert run["skipped_updates"] == 1 and run["optimizer_steps"] == 2
        assert close(run["params"], skipped["params"], tol=FP16_TOL)


def test_cpu_offload_runs_on_cpu_and_memory_estimate_holds(fsdp, ref):
    single = ref("adamw", batch_size=8, steps=3, optimizer="adamw")
    for r, res in enumerate(fsdp):
        off = res["offload"]
        assert off["devices"] == ["cpu"]
        assert off["offload_to_cpu"] == [True] and off["default_offload_to_cpu"] == [False]
        assert close(off["losses"], single["losses"]) and close(off["params"], single["params"])
        est, measured = off["estimate"], off["measured_with_grads"]
        assert est["location"] == "cpu (offloaded)"
        got = (measured["params"], measured["grads"], measured["optimizer"])
        want = (est["params"], est["grads"], est["optimizer"])
        if r == 0:  # rank 0 holds the largest (padded-size) chunks: the estimate is exact there
            assert got == want
        else:  # optimizer states follow the unpadded local shard, which is smaller on the last rank
            assert got[:2] == want[:2] and got[2] < want[2]
        assert measured["total"] <= est["params"] + est["grads"] + est["optimizer"]


def test_tied_weights_inside_one_unit_train(fsdp):
    for res in fsdp:
        tied = res["tied_in_root"]
        assert tied["same_object"] and tied["type"] == "DTensor"
        assert math.isfinite(tied["loss"]) and tied["grad_full_shape"] == [11, 6]


def test_act_under_fsdp2_matches_one_process(fsdp):
    """LeRobot's ACT (from lerobot_cli, test size, no dropout/VAE noise): units from its own
    ``_fsdp_wrap_modules``; fp32 matches a single process on the same global batch, bf16 trains."""
    single = _workload().train_act(ParallelRuntime.single("cpu"), batch_size=4, steps=3)
    for res in fsdp:
        assert res["act"]["param_types"] == ["DTensor"]
        assert close(res["act"]["losses"], single["losses"]) and close(res["act"]["params"], single["params"])
        bf16 = res["act_bf16"]["losses"]
        assert all(math.isfinite(x) for x in bf16) and close(
            bf16, single["losses"], tol=0.05 * max(single["losses"])
        )


def test_act_default_size_plan():
    from lerobot_cli.features import PolicyFeature
    from lerobot_cli.policies.act.config import ACTConfig
    from lerobot_cli.policies.act.modeling import ACTPolicy
    from lerobot_parallel import AcceleratorConfig, ParallelismConfig, build_plan

    policy = ACTPolicy(
        ACTConfig(
            input_features={
                "observation.state": PolicyFeature("STATE", (14,)),
                "observation.images.top": PolicyFeature("VISUAL", (3, 96, 96)),
            },
            output_features={"action": PolicyFeature("ACTION", (14,))},
            pretrained_backbone_weights=None,
        )
    )
    plan = build_plan(
        policy,
        ParallelRuntime.preview(ParallelismConfig(dp_shard=4)),
        AcceleratorConfig(mixed_precision="bf16"),
    )
    assert [u.class_name for u in plan.units] == ["ACTEncoderLayer"] * 8 + ["ACTDecoderLayer"]
    assert {u.path for u in plan.units} >= {
        "model.encoder.layers.3",
        "model.vae_encoder.layers.0",
        "model.decoder.layers.0",
    }
    assert plan.tied.shared == () and plan.memory.ratio <= 1.05 / 4
    assert sum(u.num_params for u in plan.units) + plan.root.num_params == sum(
        p.numel() for p in policy.parameters()
    )


def test_readme_sharded_example_runs_as_written(fsdp):
    out = fsdp[0]["readme_example"]
    assert "Sharding plan: fsdp on mesh (dp_shard=2)" in out and "blocks.1 (Block)" in out
    assert "all-gathered in bfloat16" in out
    done = out.split("FSDP_EXAMPLE_DONE ")[1].split()
    assert math.isfinite(float(done[0].split("=")[1])) and float(done[1].split("=")[1]) > 0
    assert fsdp[1]["readme_example"] == ""  # only the main rank prints


# ---- HSDP, 2 x 2 = 4 processes ---------------------------------------------------------------


def test_hsdp_runtime(hsdp):
    for r, res in enumerate(hsdp):
        rt = res["runtime"]
        assert rt["mode"] == "hsdp" and rt["mesh_dim_names"] == ["dp_replicate", "dp_shard"]
        assert rt["mesh_shape"] == [2, 2] and rt["dp_world_size"] == 4
        assert (rt["replicate_rank"], rt["shard_rank"], rt["dp_rank"]) == (r // 2, r % 2, r)


def test_hsdp_four_processes_match_one_process(hsdp, ref):
    single = ref("fp32", batch_size=8, steps=4)
    for res in hsdp:
        assert close(res["fp32"]["losses"], single["losses"])
        assert close(res["fp32"]["params"], single["params"])


def test_hsdp_shards_are_one_over_dp_shard_and_replicas_agree(hsdp):
    for r, res in enumerate(hsdp):
        for name, f in res["fp32"]["shards"].items():
            assert f["placements"] == ["R", "S(0)"], name
            assert math.prod(f["local"]) == expected_local_numels(f["full"], 2)[r % 2], name
    for r in (0, 1):  # same shard coordinate in the two replicas: identical values after training
        assert hsdp[r]["fp32"]["shards"] == hsdp[r + 2]["fp32"]["shards"]
    assert hsdp[0]["fp32"]["shards"] != hsdp[1]["fp32"]["shards"]


def test_hsdp_gradient_accumulation_skips_all_communication(hsdp, ref):
    big = ref("fp32_3", batch_size=8, steps=3)
    for res in hsdp:
        acc = res["accum"]
        assert close(acc["params"], big["params"]) and acc["optimizer_steps"] == 3
        for s in acc["per_step"]:
            if s["synced"]:
                assert s["reduce_scatters"] == 4 and s["all_reduces"] > 0
            else:
                assert s["reduce_scatters"] == 0 and s["all_reduces"] == 0


def test_hsdp_ignored_module_averaged_over_every_dp_rank(hsdp, ref):
    single = ref("clip", batch_size=8, steps=3, grad_clip_norm=0.05)
    heads = [res["ignored"]["head"] for res in hsdp]
    assert all(h == heads[0] for h in heads)
    for res in hsdp:
        assert close(res["ignored"]["losses"], single["losses"])
        assert close(res["ignored"]["params"], single["params"])


def test_hsdp_fp16_skips_the_same_update_everywhere(hsdp, ref):
    skipped = ref(
        "fp16_skip1",
        batch_size=8,
        steps=3,
        mixed_precision="fp16",
        scheduler=True,
        init_scale=2.0**40,
        backoff_factor=2.0**-32,
    )
    for res in hsdp:
        run = res["fp16"]
        assert [o["skipped"] for o in run["outputs"]] == [True, False, False]
        assert run["optimizer_steps"] == 2 and all(math.isfinite(x) for x in run["losses"])
        # replicas and shards alike: the same parameters as one process that skipped step 1
        assert close(run["params"], skipped["params"], tol=FP16_TOL)


def assert_regions(ranks: list[dict], mode: str, compiled: bool = False) -> None:
    """Checkpointing is applied inside fully_shard (each block recomputed in backward after FSDP gathered
    its shards again, fewer bytes saved; ``regions_checks.assert_applied``), and the checkpointed (full,
    selective) gradients equal the plain run's of the same layout bitwise; inductor-compiled units inside
    fully_shard within 1e-5 (fused kernels reorder sums)."""
    for res in ranks:
        for case in ("blocks", "joint"):
            got = res["regions"][case]
            assert got["grad_abs_max"] > 1e-3  # the comparison is not of zeros
            assert got["full"] == 0 and got["selective"] == 0, (mode, case, got)
            _regions_checks().assert_applied(case, got, sharded=True)
            assert got["full_regions"][0].startswith("Activation checkpointing: full, on ")
            if compiled and case == "joint":
                assert got["compiled_full_graphs"] == 1, got  # both joint blocks run one compiled graph
                assert got["compiled_full"] <= 1e-5, (mode, case, got)
                assert (
                    "Compile: torch.compile backend=inductor mode=default, regional"
                    in got["compiled_full_regions"][1]
                )
        assert res["regions"]["joint"]["full_regions"] == [
            "Activation checkpointing: full, on 3 block(s) (MainTowerLayer+SideTowerLayer x3)"
        ]


def test_activation_checkpointing_and_compile_under_fsdp2(fsdp):
    assert_regions(fsdp, "fsdp", compiled=True)


def test_activation_checkpointing_under_hsdp(hsdp):
    assert_regions(hsdp, "hsdp")

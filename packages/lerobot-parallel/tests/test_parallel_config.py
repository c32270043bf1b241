import pytest
from lerobot_parallel.config import (
    AcceleratorConfig,
    FSDPConfig,
    GradientAccumulationConfig,
    MixedPrecisionPolicyConfig,
    ParallelismConfig,
    ParallelismError,
)


@pytest.mark.parametrize(
    ("cfg", "world", "expected", "mode"),
    [
        (ParallelismConfig(), 1, (1, 1), "single"),
        (ParallelismConfig(), 4, (4, 1), "ddp"),  # untouched config on a multi-process launch → DDP
        (ParallelismConfig(dp_shard=-1), 4, (1, 4), "fsdp"),
        (ParallelismConfig(dp_shard=-1), 1, (1, 1), "single"),
        (ParallelismConfig(dp_replicate=2, dp_shard=-1), 8, (2, 4), "hsdp"),
        (ParallelismConfig(dp_replicate=2, dp_shard=2), 4, (2, 2), "hsdp"),
        (ParallelismConfig(dp_shard=4), 4, (1, 4), "fsdp"),
        (ParallelismConfig(dp_replicate=2), 2, (2, 1), "ddp"),
    ],
)
def test_resolve(cfg, world, expected, mode):
    out = cfg.resolve(world)
    assert (out.dp_replicate, out.dp_shard) == expected
    assert out.dp_world_size == world
    assert out.mode == mode


def test_resolve_mismatch_names_every_degree_and_world():
    with pytest.raises(ParallelismError) as exc:
        ParallelismConfig(dp_replicate=2, dp_shard=3).resolve(4)
    msg = str(exc.value)
    assert "dp_replicate=2" in msg and "dp_shard=3" in msg and "4 process" in msg and "6" in msg


def test_resolve_minus_one_not_divisible():
    with pytest.raises(ParallelismError, match=r"not divisible by dp_replicate=3"):
        ParallelismConfig(dp_replicate=3, dp_shard=-1).resolve(4)


def test_resolve_rejects_bad_world():
    with pytest.raises(ParallelismError):
        ParallelismConfig().resolve(0)


def test_unresolved_world_size_is_an_error():
    with pytest.raises(ParallelismError):
        ParallelismConfig(dp_shard=-1).dp_world_size  # noqa: B018 - the property raises


@pytest.mark.parametrize(
    "kwargs", [{"dp_replicate": 0}, {"dp_replicate": -1}, {"dp_shard": 0}, {"dp_shard": -2}]
)
def test_degree_validators(kwargs):
    with pytest.raises(ParallelismError, match=r"^parallelism\.dp_\w+ must be ≥ 1"):
        ParallelismConfig(**kwargs)


@pytest.mark.parametrize(
    ("build", "path"),
    [
        (lambda: ParallelismConfig(dp_shard=-3), "parallelism.dp_shard"),
        (lambda: ParallelismConfig(dp_replicate=2, dp_shard=3).resolve(4), "parallelism.dp_replicate=2"),
        (lambda: GradientAccumulationConfig(steps=0), "accelerator.gradient_accumulation.steps"),
        (lambda: AcceleratorConfig(mixed_precision="fp8"), "accelerator.mixed_precision"),
        (lambda: AcceleratorConfig(timeout_s=0), "accelerator.timeout_s"),
        (lambda: FSDPConfig(min_num_params=0), "accelerator.fsdp.min_num_params"),
        (lambda: FSDPConfig(wrap_modules=[]), "accelerator.fsdp.wrap_modules"),
        (lambda: FSDPConfig(ignored_modules="("), "accelerator.fsdp.ignored_modules"),
        (
            lambda: MixedPrecisionPolicyConfig(param_dtype="float8"),
            "accelerator.fsdp.mixed_precision_policy.param_dtype",
        ),
    ],
)
def test_messages_name_config_paths_not_flags(build, path):
    """A foreign trainer has no flags: errors name the config field, and a CLI respells it."""
    with pytest.raises(ParallelismError) as err:
        build()
    assert str(err.value).startswith(path) and "--" not in str(err.value)


def test_degree_must_be_int():
    with pytest.raises(TypeError):
        ParallelismConfig(dp_shard="2")
    with pytest.raises(TypeError):
        ParallelismConfig(dp_replicate=True)


@pytest.mark.parametrize("steps", [0, -1, 1.5, True])
def test_grad_accum_steps(steps):
    with pytest.raises(ValueError, match="gradient_accumulation.steps"):
        GradientAccumulationConfig(steps=steps)


def test_mixed_precision_choice():
    assert AcceleratorConfig(mixed_precision="bf16").mixed_precision == "bf16"
    with pytest.raises(ValueError, match="choose from no, bf16, fp16"):
        AcceleratorConfig(mixed_precision="fp8")


def test_timeout_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        AcceleratorConfig(timeout_s=0)


def test_wrap_policies_are_exclusive():
    with pytest.raises(ValueError, match="pass only one"):
        FSDPConfig(wrap_modules=["A"], min_num_params=10)


@pytest.mark.parametrize("value", [0, -5, True])
def test_min_num_params(value):
    with pytest.raises(ValueError, match="min_num_params"):
        FSDPConfig(min_num_params=value)


def test_wrap_modules_non_empty_names():
    assert FSDPConfig(wrap_modules=["A", "B"]).wrap_modules == ("A", "B")
    with pytest.raises(ValueError, match="wrap_modules"):
        FSDPConfig(wrap_modules=[])
    with pytest.raises(ValueError, match="wrap_modules"):
        FSDPConfig(wrap_modules=[""])


def test_ignored_modules_compiled_at_validation():
    assert FSDPConfig(ignored_modules=r".*\.backbone").ignored_modules_pattern.fullmatch(
        "base_model.model.backbone"
    )
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FSDPConfig(ignored_modules="(")


def test_mixed_precision_policy_needs_param_dtype():
    assert not MixedPrecisionPolicyConfig().is_set
    assert MixedPrecisionPolicyConfig(param_dtype="bfloat16").is_set
    with pytest.raises(ValueError, match="param_dtype must be set"):
        MixedPrecisionPolicyConfig(reduce_dtype="float32")
    with pytest.raises(ValueError, match="param_dtype must be set"):
        MixedPrecisionPolicyConfig(cast_forward_inputs=True)
    with pytest.raises(ValueError, match="choose from float32, bfloat16, float16"):
        MixedPrecisionPolicyConfig(param_dtype="float8")


def test_float16_policy_needs_fp16_mixed_precision():
    fsdp = FSDPConfig(mixed_precision_policy=MixedPrecisionPolicyConfig(param_dtype="float16"))
    with pytest.raises(ValueError, match="mixed_precision=fp16"):
        AcceleratorConfig(mixed_precision="bf16", fsdp=fsdp)
    assert AcceleratorConfig(mixed_precision="fp16", fsdp=fsdp).fsdp is fsdp


def test_config_import_is_torch_free():
    import subprocess
    import sys

    code = "import sys, lerobot_parallel, lerobot_parallel.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""The accelerate-env guard: what it refuses, what it must let through, and its messages.

The "plain launch" environments below are the exact sets accelerate 1.15 exported in a real
launch on CPU (see README); tests/test_accelerate_launch.py re-derives them from accelerate's
own code and from real launches.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from lerobot_parallel.env_guard import (
    ALLOW_ENV_VAR,
    AccelerateEnvError,
    check_accelerate_env,
    enforce_accelerate_env_guard,
    guard_message,
    is_allow_value,
)

DYNAMO = {
    "ACCELERATE_DYNAMO_BACKEND": "NO",
    "ACCELERATE_DYNAMO_MODE": "default",
    "ACCELERATE_DYNAMO_USE_DYNAMIC": "False",
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False",
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": "False",
}
SIMPLE_LAUNCH = {
    **DYNAMO,
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_USE_CPU": "False",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "OMP_NUM_THREADS": "1",
}
CPU_LAUNCH = {
    **SIMPLE_LAUNCH,
    "ACCELERATE_USE_CPU": "True",
    "KMP_AFFINITY": "granularity=fine,compact,1,0",
    "KMP_BLOCKTIME": "1",
}
MULTI_GPU_LAUNCH = {
    **DYNAMO,
    "ACCELERATE_MIXED_PRECISION": "no",
    "ACCELERATE_USE_CPU": "true",
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "ROLE_RANK": "1",
    "TORCHELASTIC_RUN_ID": "none",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
    "OMP_NUM_THREADS": "1",
    "ACCELERATE_DEBUG_MODE": "true",
    "ACCELERATE_CPU_AFFINITY": "1",
}


@pytest.mark.parametrize(
    "env", [SIMPLE_LAUNCH, CPU_LAUNCH, MULTI_GPU_LAUNCH, {}], ids=["simple", "cpu", "multi", "empty"]
)
def test_plain_launch_environments_pass(env):
    result = check_accelerate_env("no", env)
    assert result.clean and result.may_proceed and result.offending == ()
    assert enforce_accelerate_env_guard("no", env) == result


@pytest.mark.parametrize(
    "name,value",
    [
        ("ACCELERATE_USE_FSDP", "true"),
        ("ACCELERATE_USE_FSDP", "True"),
        ("ACCELERATE_USE_PARALLELISM_CONFIG", "true"),
        ("ACCELERATE_USE_DEEPSPEED", "1"),
        ("ACCELERATE_USE_MEGATRON_LM", "true"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4"),
        ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1"),
        ("FSDP_SHARDING_STRATEGY", "FULL_SHARD"),
        ("FSDP_VERSION", "2"),
        ("PARALLELISM_CONFIG_DP_SHARD_SIZE", "2"),
        ("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2"),
    ],
)
def test_each_engine_variable_is_refused(name, value):
    env = {**MULTI_GPU_LAUNCH, name: value}
    result = check_accelerate_env("no", env)
    assert result.names == (name,)
    assert not result.may_proceed
    with pytest.raises(AccelerateEnvError) as err:
        enforce_accelerate_env_guard("no", env)
    assert isinstance(err.value, ValueError)  # the CLI maps ValueError subclasses to exit 2
    assert f"{name}={value}" in str(err.value)


@pytest.mark.parametrize("value", ["false", "0", "no", "False", ""])
def test_switches_set_to_false_configure_nothing(value):
    assert check_accelerate_env("no", {"ACCELERATE_USE_FSDP": value, "ACCELERATE_USE_DEEPSPEED": value}).clean


@pytest.mark.parametrize(
    "theirs,ours,refused",
    [
        ("no", "no", False),
        ("no", "bf16", False),
        ("no", "fp16", False),
        ("bf16", "bf16", False),
        ("FP16", "fp16", False),
        ("bf16", "no", True),
        ("fp16", "bf16", True),
        ("fp8", "bf16", True),
        ("fp8", "no", True),
    ],
)
def test_mixed_precision_refused_only_when_it_disagrees(theirs, ours, refused):
    result = check_accelerate_env(ours, {"ACCELERATE_MIXED_PRECISION": theirs})
    assert (result.names == ("ACCELERATE_MIXED_PRECISION",)) is refused


@pytest.mark.parametrize(
    "value,allowed",
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        (" Yes ", True),
        ("0", False),
        ("false", False),
        ("", False),
        ("2", False),
        ("on", False),
        (None, False),
    ],
)
def test_allow_values(value, allowed):
    assert is_allow_value(value) is allowed
    env = {"FSDP_VERSION": "2"} | ({} if value is None else {ALLOW_ENV_VAR: value})
    assert check_accelerate_env("no", env).may_proceed is allowed


def test_allowed_env_proceeds_with_a_warning_listing_the_overrides():
    env = {**SIMPLE_LAUNCH, "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", ALLOW_ENV_VAR: "1"}
    seen: list[str] = []
    result = enforce_accelerate_env_guard("no", env, warn=seen.append)
    assert result.allowed and result.names == ("ACCELERATE_USE_FSDP", "FSDP_VERSION")
    assert len(seen) == 1 and "ACCELERATE_USE_FSDP=true" in seen[0] and "FSDP_VERSION=2" in seen[0]
    assert "IGNORED" in seen[0] and "overridden" in seen[0]
    with pytest.warns(UserWarning, match="FSDP_VERSION=2"):
        enforce_accelerate_env_guard("no", env)


def test_refusal_message_lists_variables_and_both_ways_out():
    env = {**SIMPLE_LAUNCH, "PARALLELISM_CONFIG_TP_SIZE": "1", "ACCELERATE_MIXED_PRECISION": "fp16"}
    result = check_accelerate_env("bf16", env)
    text = guard_message(result)
    assert result.names == ("ACCELERATE_MIXED_PRECISION", "PARALLELISM_CONFIG_TP_SIZE")
    assert "  ACCELERATE_MIXED_PRECISION=fp16\n  PARALLELISM_CONFIG_TP_SIZE=1" in text
    assert "parallelism.dp_shard=N" in text and "accelerator.mixed_precision=bf16" in text
    assert "--parallelism" not in text and "--accelerator" not in text  # config paths, not a CLI's flags
    assert f"{ALLOW_ENV_VAR}=1" in text
    for name in DYNAMO:
        assert name not in text


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", "true")
    monkeypatch.delenv(ALLOW_ENV_VAR, raising=False)
    assert check_accelerate_env().names == ("FSDP_OFFLOAD_PARAMS",)


def test_packages_import_without_torch():
    """The CLI's --help imports configs and the guard; they may not pull in torch. (lerobot_trainloop
    imports torch on purpose: every piece of it needs torch.)"""
    code = (
        "import sys, lerobot_parallel, lerobot_parallel.env_guard, lerobot_parallel.launch_env, "
        "lerobot_parallel.batching\n"
        "lerobot_parallel.ParallelismConfig().resolve(2); lerobot_parallel.check_accelerate_env()\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_lazy_names_resolve_to_the_torch_modules():
    import lerobot_parallel
    import lerobot_trainloop
    from lerobot_parallel import precision, runtime, teardown, wrap

    assert (
        lerobot_parallel.wrap_model is wrap.wrap_model
        and lerobot_parallel.init_runtime is runtime.init_runtime
    )
    assert lerobot_parallel.parallel_session is teardown.parallel_session
    assert lerobot_parallel.build_precision is precision.build_precision
    assert lerobot_trainloop.effective_batch_line is lerobot_parallel.effective_batch_line
    assert set(lerobot_parallel._LAZY) <= set(lerobot_parallel.__all__)
    for name in lerobot_parallel.__all__ + lerobot_trainloop.__all__:
        assert (
            getattr(lerobot_parallel if name in lerobot_parallel.__all__ else lerobot_trainloop, name)
            is not None
        )
    with pytest.raises(AttributeError):
        getattr(lerobot_parallel, "no_such_name")  # noqa: B009

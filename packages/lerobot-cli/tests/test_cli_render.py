"""Library messages name config paths; the CLI prints them as its flags, in one place (``as_flags``)."""

import pytest
from lerobot_cli.cli.render import as_flags, flag_paths
from lerobot_parallel import AcceleratorConfig, FSDPConfig, ParallelismConfig, ParallelismError
from lerobot_parallel.env_guard import ALLOW_ENV_VAR, check_accelerate_env, guard_message
from lerobot_parallel.fsdp_precision import MP, MPP
from lerobot_parallel.wrap_units import IGNORED_MODULES, MIN_NUM_PARAMS, WRAP_MODULES


@pytest.mark.parametrize("path", [WRAP_MODULES, MIN_NUM_PARAMS, IGNORED_MODULES, MP, MPP])
def test_every_path_the_library_names_is_a_flag(path):
    assert path in flag_paths()
    assert as_flags(f"{path} is wrong") == f"--{path} is wrong"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "parallelism.dp_replicate=2 parallelism.dp_shard=2: no",
            "--parallelism.dp_replicate=2 --parallelism.dp_shard=2: no",
        ),
        ("with parallelism.* / accelerator.* instead.", "with --parallelism.* / --accelerator.* instead."),
        (
            "from accelerator.fsdp.mixed_precision_policy.*)",
            "from --accelerator.fsdp.mixed_precision_policy.*)",
        ),
        ("device=tpu: not a torch device", "--policy.device=tpu: not a torch device"),
        # lerobot_ckpt's run settings (config paths in the library, flags here)
        (
            "its weights use policy.path=/runs/a/pretrained_model",
            "its weights use --policy.path=/runs/a/pretrained_model",
        ),
        ("(written by checkpoint_format=dcp), which", "(written by --checkpoint_format=dcp), which"),
        (
            "by the parallelism.* / accelerator.* settings of",
            "by the --parallelism.* / --accelerator.* flags of",
        ),
        # left alone: flags already, unknown keys, attribute chains, files, prose, calls
        (
            "--accelerator.fsdp.wrap_modules: expected a JSON list",
            "--accelerator.fsdp.wrap_modules: expected a JSON list",
        ),
        ("unknown key(s) accelerator.fsdp.wrap_modulez", "unknown key(s) accelerator.fsdp.wrap_modulez"),
        ("cfg.accelerator.mixed_precision", "cfg.accelerator.mixed_precision"),
        ("runs/accelerator.mixed_precision", "runs/accelerator.mixed_precision"),
        ("the accelerator; choose device 'cpu'", "the accelerator; choose device 'cpu'"),
        ("call parallelism.resolve(world_size)", "call parallelism.resolve(world_size)"),
        ("saved --scheduler settings", "saved --scheduler settings"),
        ("the parallelism settings", "the parallelism settings"),
        ("accelerator.* / parallelism.bogus.* settings", "--accelerator.* / parallelism.bogus.* settings"),
    ],
)
def test_as_flags_rewrites_exactly_the_known_paths(text, shown):
    assert as_flags(text) == shown
    assert as_flags(shown) == shown  # idempotent: a message may pass two printers


@pytest.mark.parametrize(
    ("build", "printed"),
    [
        (lambda: ParallelismConfig(dp_replicate=0), "--parallelism.dp_replicate must be ≥ 1, got 0"),
        (
            lambda: FSDPConfig(wrap_modules=["A"], min_num_params=3),
            "--accelerator.fsdp.wrap_modules and --accelerator.fsdp.min_num_params are two ways",
        ),
        (
            lambda: AcceleratorConfig(mixed_precision="fp8"),
            "--accelerator.mixed_precision: invalid choice 'fp8'",
        ),
    ],
)
def test_library_errors_read_as_today_once_rendered(build, printed):
    with pytest.raises(ParallelismError) as err:
        build()
    assert "--" not in str(err.value) and as_flags(str(err.value)).startswith(printed)


def test_the_env_guard_reads_as_flags_once_rendered():
    refusal = as_flags(guard_message(check_accelerate_env("no", {"ACCELERATE_USE_FSDP": "true"})))
    assert (
        "make the same choices with the --parallelism.* / --accelerator.* flags instead, "
        "e.g. --parallelism.dp_shard=N, --accelerator.mixed_precision=bf16"
    ) in refusal
    allowed = check_accelerate_env("no", {"ACCELERATE_USE_FSDP": "true", ALLOW_ENV_VAR: "1"})
    warning = as_flags(guard_message(allowed))
    assert "overridden by the --parallelism.* / --accelerator.* flags of this run" in warning
    assert "settings of this run" not in warning and "settings instead" not in refusal

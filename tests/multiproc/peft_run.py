"""One real ``lerobot-train`` PEFT run on this rank (flags as on the command line), then checks of the
live model that the checkpoint alone cannot show.

argv: ``<out_dir> <base pretrained_model dir> <lerobot-train flags...>``, or several such runs, each
ended by ``--then``: they run one after another in the same ranks (each in its own process group), so
the launch's start-up is paid once. For every run, every rank writes
``rank<r>.json``: for each frozen base parameter whether it is bitwise the base file's tensor, the
dtypes of frozen and trainable parameters, local vs global sizes of base weights (the shard a rank
holds), and whether each adapter moved away from its initial value. Rank 0 also writes the trained
adapter (full tensors, peft's names) and the action chunk of a fixed batch, which the test compares
with what ``load_pretrained`` rebuilds from the checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arm_watchdog, rank, write_json

arm_watchdog(600)

import torch
from lerobot_ckpt import read_tensors, unwrap_model
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.checks import check_runnable
from lerobot_cli.peft.adapters import adapter_state, base_policy
from lerobot_cli.runner import train
from lerobot_cli.runplan import plan_run
from lerobot_parallel.teardown import parallel_session
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor

PEFT_PREFIX = "base_model.model."


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def base_key(name: str) -> str:
    """A frozen parameter's name in the base policy's ``model.safetensors``."""
    return name.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".").replace(".original_module.", ".")


def fixed_batch(policy) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    batch = {k: torch.randn((2, *f.shape), generator=g) for k, f in policy.config.input_features.items()}
    return batch


def checks(model, base_file: Path) -> dict:
    peft = unwrap_model(model)
    base = read_tensors(base_file)[0]
    frozen, trainable, shards = {}, {}, {}
    for name, p in peft.named_parameters():
        value = full(p.detach())
        if p.requires_grad:
            moved = bool(value.abs().sum() > 0) if ".lora_B." in name else None
            if ".modules_to_save." in name:
                original = base[base_key(name.replace(".modules_to_save.default.", ".original_module."))]
                moved = not torch.equal(value.float(), original.float())
            trainable[name] = {"dtype": str(p.dtype), "moved": moved}
        else:
            ref = base[base_key(name)]
            frozen[name] = {
                "dtype": str(p.dtype),
                "bitwise_base": value.dtype == ref.dtype and torch.equal(value, ref),
            }
        if isinstance(p, DTensor) and not p.requires_grad and p.dim() == 2:
            shards[name] = [p.to_local().numel(), p.numel(), list(p.shape)]
    return {"frozen": frozen, "trainable": trainable, "shards": shards}


def split_runs(argv: list[str]) -> list[list[str]]:
    runs, current = [], []
    for arg in argv:
        if arg == "--then":
            runs.append(current)
            current = []
        else:
            current.append(arg)
    return [*runs, current] if current else runs


def main() -> None:
    for run in split_runs(sys.argv[1:]):
        run_one(Path(run[0]), Path(run[1]), run[2:])


def run_one(out: Path, base_dir: Path, argv: list[str]) -> None:
    flags = split_argv(argv).flags
    result = build_train_config(flags)
    cfg = result.config.finalized()
    check_runnable(cfg, result.config_path)
    plan = plan_run(cfg, flags, result.config_path)  # the base pin, as lerobot-train makes it
    with parallel_session(cfg.parallelism, cfg.accelerator, device="cpu") as runtime:
        loop = train(plan, runtime)
        model = loop.model
        report = checks(model, base_dir / "model.safetensors")
        adapter = {
            k: full(v.detach()).contiguous()
            for k, v in adapter_state(unwrap_model(model))(get_model_state_dict(model)).items()
        }
        inner = base_policy(unwrap_model(model))
        model.eval()
        if hasattr(model, "unshard"):
            model.unshard()  # FSDP2: gather the root; units gather in their own forward hooks
        with (
            torch.no_grad(),
            loop.precision.autocast(),
        ):  # a bf16 base computes under autocast, as in training
            actions = inner.predict_action_chunk(fixed_batch(inner)).contiguous()
        if hasattr(model, "reshard"):
            model.reshard()
        if rank() == 0:
            save_file(adapter, str(out / "final_adapter.safetensors"))
            save_file({"actions": actions, **fixed_batch(inner)}, str(out / "fixed_batch.safetensors"))
        write_json(
            out / f"rank{rank()}.json",
            {**report, "step": loop.step, "dp_shard": runtime.parallelism.dp_shard},
        )


if __name__ == "__main__":
    main()

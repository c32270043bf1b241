"""Every ```bash block of docs/guide.md, run for real in tiny form, so the guide cannot rot.

Parsing and rewriting live in ``tests/guide_harness.py``; this module runs the blocks and checks them.

How a block becomes a test
--------------------------
Each ```bash block is parsed into commands (``\\`` continuations joined, ``#`` comments dropped, one
command per line) and rewritten generically:

* ``--dataset.repo_id=${HF_USER}/<name>`` → the bundled demo dataset (``--dataset.root`` added; for a
  mixture, ``--dataset.repo_id='["${HF_USER}/a", ...]'``, a ``--dataset.root`` list naming it per entry;
  a name with ``front`` in it: a copy of the demo whose camera is ``observation.images.front``);
  ``--policy.path=${HF_USER}/<name>`` → a tiny ACT ``pretrained_model/`` trained once per session;
  other ``${HF_USER}`` → ``me``; ``${MAIN_NODE}`` → ``127.0.0.1``; ``$(which X)`` → the environment's X;
  a flag value starting ``data/`` (the repository's bundled dataset and tokenizer) → that path in the
  repository.
* ``lerobot-train`` (direct, or the script of ``torchrun`` / ``accelerate launch``): ``--num_workers=0
  --log_freq=1 --steps=2`` appended (later flags win), a tiny ACT when the command says
  ``--policy.type=act``, a tiny pi0 / pi05 with the demo tokenizer when it says ``--policy.type=pi0`` or
  ``pi05``, a tiny FastWAM (``--policy.variant=tiny``, the demo tokenizer) when it says
  ``--policy.type=fastwam`` without ``--policy.variant=tiny`` (neither for ``--dry_run=true``, which
  plans the full size on the meta device); a
  ``--resume=true`` command gets ``--steps=<checkpoint step + 2>``.
* launchers get a free port; ``uv sync`` runs as ``--locked --dry-run --offline`` (it must not change the
  shared environment); ``source X`` checks that X activates an environment holding ``lerobot-train``.
* every command runs in a per-chain work directory (relative ``outputs/...`` land there), with no GPU
  visible, ``HF_HUB_OFFLINE=1`` (``0`` for a command that publishes: the fake Hub then answers its
  whoami and records its two write calls instead of sending them).

An HTML comment on the line directly above a block tunes it (all keys optional, values may be quoted):

    <!-- test: id=NAME chain=NAME replace="OLD=>NEW" steps=N rc=0|nonzero|N concurrent=true
               expect="text in the output" expect_file=PATH absent_file=PATH -->

``replace`` (literal, applied first) and ``expect*`` may repeat. Blocks of one ``chain`` run in document
order in one test, in one work directory, so train → convert → resume see each other's files; a block
without ``chain`` is its own chain. ``concurrent=true`` starts the block's commands together (one per
node of a multi-node job). Besides the ``expect*`` keys every command is checked generically: exit
code, the banner's world size, the checkpoint written, the Hub upload announced and recorded, the
trackio database written, the converter's result line.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest


def _load_harness():
    name = "lerobot_tests_guide_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, Path(__file__).resolve().parent / "guide_harness.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


H = _load_harness()
Block, Command, Context = H.Block, H.Command, H.Context
GUIDE, REPO = H.GUIDE, H.REPO
block_commands, build_command, command_lines, environment = (
    H.block_commands,
    H.build_command,
    H.command_lines,
    H.environment,
)
BLOCKS = H.parse_guide(GUIDE.read_text()) if GUIDE.is_file() else []
CHAINS = H.chains(BLOCKS)


# --------------------------------------------------------------------------------------------- running
def run_block(block: Block, ctx: Context, launch) -> tuple[list[Command], list]:
    ctx.port = launch.free_port()
    commands = block_commands(block, ctx)
    if any(c.kind == "uv" for c in commands) and shutil.which("uv") is None:
        pytest.skip("uv is not installed here")
    needs_hub = "--policy.repo_id=" in block.body or "--push_to_hub=" in block.body
    run = [
        lambda c=c: launch.run_command(
            c.argv, timeout_s=c.timeout_s, env=environment(ctx, c, needs_hub), cwd=c.cwd
        )
        for c in commands
    ]
    if block.spec.get("concurrent") == "true":
        results: list = [None] * len(run)

        def target(i: int) -> None:
            results[i] = run[i]()

        threads = [threading.Thread(target=target, args=(i,)) for i in range(len(run))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        results = []
        for r in run:
            results.append(r())
            if results[-1].returncode != 0 and block.spec.get("rc", "0") == "0":
                break  # the next command of the block would only fail on the missing output
    return commands, results


def _expected_rc(spec: dict, rc: int) -> bool:
    want = spec.get("rc", "0")
    return rc != 0 if want == "nonzero" else rc == int(want)


def _hub_calls(ctx: Context) -> list[dict]:
    log = ctx.workdir / "hub.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def check_block(block: Block, ctx: Context, commands: list[Command], results: list) -> None:
    where = block.where()
    assert len(results) == len(commands), f"{where}: stopped early:\n" + results[-1].describe()
    for cmd, res in zip(commands, results):
        assert not res.timed_out, f"{where}: `{cmd.source}` timed out:\n{res.describe()}"
        assert _expected_rc(block.spec, res.returncode), (
            f"{where}: `{cmd.source}` exit code {res.returncode}, expected {block.spec.get('rc', '0')}:\n"
            + res.describe()
        )
    output = "\n".join(r.output for r in results)
    succeeded = block.spec.get("rc", "0") == "0"
    # A concurrent block is one job (e.g. one command per node): its checks look at the joint output.
    jobs = (
        [(commands[0], output)]
        if block.spec.get("concurrent") == "true"
        else [(c, r.output) for c, r in zip(commands, results)]
    )
    for cmd, out in jobs:
        if succeeded:
            check_command(cmd, out, ctx, where)
    for text in block.spec["expect"]:
        assert text in output, f"{where}: expected {text!r} in the output:\n" + "\n".join(
            r.describe() for r in results
        )
    for rel in block.spec["expect_file"]:
        assert (ctx.workdir / rel).exists(), f"{where}: expected {rel} to exist"
    for rel in block.spec["absent_file"]:
        assert not (ctx.workdir / rel).exists(), f"{where}: expected {rel} not to exist"


def check_command(cmd: Command, out: str, ctx: Context, where: str) -> None:
    what = f"{where}: `{cmd.source}`"
    if cmd.kind == "help":
        assert "usage:" in out, f"{what}: no usage text"
    elif cmd.kind == "activate":
        assert "lerobot-train" in out, f"{what}: the activated environment has no lerobot-train"
    elif cmd.kind == "dry_run":
        assert '"dry_run": true' in out and "Sharding plan:" in out, (
            f"{what}: no resolved config/plan:\n{out}"
        )
    elif cmd.kind == "convert":
        assert "lerobot-convert-dcp: wrote " in out, f"{what}: no result line:\n{out}"
        repo = cmd.flag("push_to_hub")
        if repo:
            assert f"to https://hf.byter.me/{repo}" in out, f"{what}: no upload line:\n{out}"
            commits = [
                c for c in _hub_calls(ctx) if c["call"] == "create_commit" and c.get("repo_id") == repo
            ]
            assert commits and "model.safetensors" in commits[-1]["files"], f"{what}: nothing uploaded"
            assert not any("pytorch_model_fsdp_0" in f for f in commits[-1]["files"])
    elif cmd.kind == "eval":  # lerobot-eval: LeRobot's summary line and eval_info.json
        assert "Overall Aggregated Metrics: pc_success=" in out, f"{what}: no metrics line:\n{out}"
        out_dir = cmd.flag("output_dir")
        if out_dir:
            assert (ctx.workdir / out_dir / "eval_info.json").is_file(), f"{what}: no eval_info.json"
    elif cmd.kind == "train":
        assert f"world size {cmd.world};" in out, f"{what}: expected a world size of {cmd.world}:\n{out}"
        assert "Effective batch size: " in out and "\ncheckpoint: " in out, (
            f"{what}: no banner/checkpoint:\n{out}"
        )
        out_dir = cmd.flag("output_dir")
        if out_dir:
            last = ctx.workdir / out_dir / "checkpoints" / "last"
            assert (last / "training_state" / "training_step.json").is_file(), (
                f"{what}: no checkpoint in {last}"
            )
            assert (ctx.workdir / out_dir / "metrics.jsonl").is_file(), f"{what}: no metrics.jsonl"
        repo = cmd.flag("policy.repo_id")
        if repo and cmd.flag("policy.push_to_hub") not in ("false", "0"):
            assert f"published to {repo}" in out, f"{what}: not published:\n{out}"
            calls = [c for c in _hub_calls(ctx) if c.get("repo_id") == repo]
            assert [c["call"] for c in calls][-2:] == ["create_repo", "create_commit"], calls
            assert {c["rank"] for c in calls} == {"0"}, f"{what}: a rank other than the main one uploaded"
        if cmd.flag("trackio.enable") == "true":
            project = cmd.flag("trackio.project") or cmd.flag("job_name")
            dbs = sorted(p.name for p in (ctx.workdir / "trackio").glob("*.db"))
            assert (f"{project}.db" in dbs) if project else dbs, f"{what}: trackio logged nothing ({dbs})"
        if cmd.flag("wandb.enable") == "true" and cmd.flag("wandb.mode") == "offline":
            runs = list((ctx.workdir / out_dir / "wandb").glob("offline-run-*/run-*.wandb"))
            assert len(runs) == 1, f"{what}: wandb wrote no offline run ({runs})"


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def guide_env(tmp_path_factory, launch):
    """Session-wide: a lazily trained base policy (``--policy.path=${HF_USER}/...`` points at it)."""
    cache: dict[str, Path] = {}

    def base_policy() -> Path:
        if "path" not in cache:
            work = tmp_path_factory.mktemp("base_policy")
            ctx = Context(work, base_policy, launch.free_port())
            cmd = build_command(
                "lerobot-train --dataset.repo_id=${HF_USER}/base_data --policy.type=act --output_dir=base",
                {},
                ctx,
            )
            res = launch.run_command(
                cmd.argv, timeout_s=H.LAUNCH_TIMEOUT_S, env=environment(ctx, cmd, False), cwd=work
            )
            assert res.returncode == 0, res.describe()
            cache["path"] = work / "base" / "checkpoints" / "last" / "pretrained_model"
        return cache["path"]

    return base_policy


# --------------------------------------------------------------------------------------------- tests
def test_every_guide_command_is_covered():
    """Every ```bash block is parsed, belongs to a chain that runs, and consists of runnable commands."""
    text = GUIDE.read_text()
    assert BLOCKS, "docs/guide.md has no ```bash block"
    fences = re.findall(r"^```bash", text, re.MULTILINE)
    assert len(BLOCKS) == len(fences), "a ```bash fence the parser did not take"
    assert not re.search(r"^```(sh|shell|console|zsh|shell-session)\b", text, re.MULTILINE), (
        "write commands in ```bash blocks (those are the ones this test runs)"
    )
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids)), f"duplicate block ids: {ids}"
    ran = sorted(b.index for blocks in CHAINS.values() for b in blocks)
    assert ran == list(range(len(BLOCKS)))
    for name, blocks in CHAINS.items():  # a chain runs in document order, in one test
        assert [b.index for b in blocks] == sorted(b.index for b in blocks), name
    ctx = Context(Path("/nonexistent"), lambda: Path("/base/pretrained_model"), 1)
    for b in BLOCKS:
        assert command_lines(b.body), f"{b.where()}: an empty block"
        # parse only (a resume's step count would come from a checkpoint that does not exist yet)
        for cmd in block_commands(Block(b.index, b.line, b.body, {"steps": "2", **b.spec}), ctx):
            assert cmd.argv and cmd.kind, cmd


def test_guide_covers_the_seed_guide():
    """The sections, flags and file names of the user's multi-GPU training guide are all documented."""
    text = GUIDE.read_text()
    for heading in (
        "## Installation",
        "## Launching",
        "### torchrun",
        "### accelerate launch, as a plain launcher",
        "### CPU-only machines",
        "### Multi-node",
        "## DDP",
        "## Batch size, learning rate and steps",
        "## Sharded training (FSDP2)",
        "### Wrap units",
        "### Tied weights",
        "## HSDP",
        "## Precision",
        "## PEFT (LoRA)",
        "## Checkpoints",
        "### Formats",
        "## Converting DCP checkpoints",
        "## Resuming",
        "## Experiment tracking",
        "## Interrupts and failures",
        "## Trust",
        "## Notes",
    ):
        assert re.search(rf"^{re.escape(heading)}$", text, re.MULTILINE), f"missing section {heading!r}"
    for needle in (
        "torchrun --nproc-per-node",
        "accelerate launch --num_processes",
        "--nnodes",
        "--node-rank",
        "--rdzv-endpoint",
        "--num_machines",
        "--machine_rank",
        "--main_process_ip",
        "--config_file",
        "LEROBOT_ALLOW_ACCELERATE_ENV=1",
        "--parallelism.dp_shard=-1",
        "--parallelism.dp_replicate",
        "--accelerator.gradient_accumulation.steps",
        "--optimizer.lr",
        "--steps",
        "--batch_size",
        "effective_batch_size = batch_size × dp_world_size × gradient_accumulation_steps",
        "_fsdp_wrap_modules",
        "--accelerator.fsdp.wrap_modules",
        "--accelerator.fsdp.min_num_params",
        "--accelerator.fsdp.reshard_after_forward",
        "--accelerator.fsdp.cpu_offload",
        "--accelerator.fsdp.ignored_modules",
        "--accelerator.fsdp.mixed_precision_policy",
        "param_dtype",
        "reduce_dtype",
        "output_dtype",
        "cast_forward_inputs",
        "--accelerator.mixed_precision",
        "bf16",
        "fp16",
        "--checkpoint_format",
        "safetensors_dcp",
        "pytorch_model_fsdp_0/",
        "optimizer_0/",
        "model.safetensors",
        "optimizer_state.safetensors",
        "optimizer_param_groups.json",
        "rng_state.safetensors",
        "scheduler_state.json",
        "scaler_state.json",
        "training_step.json",
        "train_config.json",
        "config.json",
        "policy_preprocessor.json",
        "policy_postprocessor.json",
        "lerobot-convert-dcp",
        "--dtype",
        "--delete_dcp",
        "--push_to_hub",
        "--overwrite",
        "--resume=true",
        "--config_path",
        "--trackio.enable",
        "--policy.repo_id",
        "--policy.path",
        "--job_name",
        "--output_dir",
        "0.6.x",
        "samples_per_s",
    ):
        assert needle in text, f"the guide does not mention {needle!r}"
    assert "](docs/guide.md)" in (REPO / "README.md").read_text(), "README.md does not link the guide"


@pytest.mark.slow
@pytest.mark.parametrize("chain", list(CHAINS), ids=list(CHAINS))
def test_guide_chain_runs(chain, guide_env, launch, tmp_path):
    ctx = Context(tmp_path, guide_env, 0)
    for block in CHAINS[chain]:
        commands, results = run_block(block, ctx, launch)
        for cmd, res in zip(commands, results):
            print(f"[guide] {block.id}: {res.elapsed_s:5.1f} s  {cmd.source[:90]}")  # shown with -s
        check_block(block, ctx, commands, results)

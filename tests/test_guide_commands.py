"""Every ```bash block of docs/guide.md, run for real in tiny form, so the guide cannot rot.

How a block becomes a test
--------------------------
Each ```bash block is parsed into commands (``\\`` continuations joined, ``#`` comments dropped, one
command per line) and rewritten generically:

* ``--dataset.repo_id=${HF_USER}/<name>`` → the bundled demo dataset (``--dataset.root`` added);
  ``--policy.path=${HF_USER}/<name>`` → a tiny ACT ``pretrained_model/`` trained once per session;
  other ``${HF_USER}`` → ``me``; ``${MAIN_NODE}`` → ``127.0.0.1``; ``$(which X)`` → the environment's X.
* ``lerobot-train`` (direct, or the script of ``torchrun`` / ``accelerate launch``): ``--num_workers=0
  --log_freq=1 --steps=2`` appended (later flags win), a tiny ACT when the command says
  ``--policy.type=act``; a ``--resume=true`` command gets ``--steps=<checkpoint step + 2>``.
* launchers get a free port; ``uv sync`` runs as ``--locked --dry-run --offline`` (it must not change the
  shared environment); ``source X`` checks that X activates an environment holding ``lerobot-train``.
* every command runs in a per-chain work directory (relative ``outputs/...`` land there), with no GPU
  visible, ``HF_HUB_OFFLINE=1``, and the Hub's two write calls recorded instead of sent.

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

import json
import os
import re
import shlex
import shutil
import sys
import threading
from collections import OrderedDict
from pathlib import Path

import pytest
from attrs import define, field

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
DEMO = REPO / "data" / "lerobot" / "demo_reach"
BIN = Path(sys.executable).parent
PYTHON = sys.executable

DEFAULT_STEPS = 2
TINY_ACT = ["--policy.dim_model=32", "--policy.dim_feedforward=64", "--policy.n_heads=2",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1", "--policy.n_vae_encoder_layers=1",
            "--policy.chunk_size=5", "--policy.n_action_steps=5"]
TINY_RUN = ["--num_workers=0", "--log_freq=1"]
LAUNCH_TIMEOUT_S = 240  # hard limit per command; the whole file takes ~2.5 min on 2 CPU cores
TOOL_TIMEOUT_S = 120

# Loaded at start-up by every process of a block that publishes (PYTHONPATH): huggingface_hub's real
# code path runs, only its two network calls are replaced by recorders (as in tests/test_publish.py).
FAKE_HUB = '''
import json, os, huggingface_hub
LOG = os.environ["FAKE_HUB_LOG"]
def _record(kind, **kw):
    with open(LOG, "a") as f:
        f.write(json.dumps({"call": kind, "rank": os.environ.get("RANK", "0"), **kw}) + "\\n")
def create_repo(self, repo_id, **kw):
    _record("create_repo", repo_id=repo_id, private=kw.get("private"))
def create_commit(self, repo_id, operations, **kw):
    _record("create_commit", repo_id=repo_id, files=sorted(op.path_in_repo for op in operations))
huggingface_hub.HfApi.create_repo = create_repo
huggingface_hub.HfApi.create_commit = create_commit
'''

ANNOTATION = re.compile(r"<!--\s*test:(.*?)-->\s*$")
FENCE = re.compile(r"^```bash[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
REPEATED = ("replace", "expect", "expect_file", "absent_file")
KEYS = {"id", "chain", "steps", "rc", "concurrent", *REPEATED}


# --------------------------------------------------------------------------------------------- parsing
@define
class Block:
    index: int
    line: int
    body: str
    spec: dict

    @property
    def id(self) -> str:
        return self.spec.get("id") or f"block{self.index + 1}-line{self.line}"

    @property
    def chain(self) -> str:
        return self.spec.get("chain") or self.id

    def where(self) -> str:
        return f"docs/guide.md:{self.line} ({self.id})"


def parse_annotation(text: str, where: str) -> dict:
    spec: dict = {k: [] for k in REPEATED}
    for token in shlex.split(text):
        key, eq, value = token.partition("=")
        assert eq and key in KEYS, f"{where}: bad annotation item {token!r} (keys: {sorted(KEYS)})"
        if key in REPEATED:
            spec[key].append(value)
        else:
            spec[key] = value
    for rule in spec["replace"]:
        assert "=>" in rule, f"{where}: replace needs OLD=>NEW, got {rule!r}"
    return spec


def parse_guide(text: str) -> list[Block]:
    blocks = []
    for i, m in enumerate(FENCE.finditer(text)):
        line = text.count("\n", 0, m.start()) + 1
        above = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        ann = ANNOTATION.search(above)
        where = f"docs/guide.md:{line}"
        spec = parse_annotation(ann.group(1), where) if ann else parse_annotation("", where)
        blocks.append(Block(i, line, m.group(1), spec))
    return blocks


def chains(blocks: list[Block]) -> OrderedDict[str, list[Block]]:
    out: OrderedDict[str, list[Block]] = OrderedDict()
    for b in blocks:
        out.setdefault(b.chain, []).append(b)
    return out


def command_lines(body: str) -> list[str]:
    """One string per command: continuations joined; blank and comment-only lines dropped."""
    joined = re.sub(r"\\\n", " ", body)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


BLOCKS = parse_guide(GUIDE.read_text()) if GUIDE.is_file() else []
CHAINS = chains(BLOCKS)


# --------------------------------------------------------------------------------------------- commands
@define
class Context:
    """What a block's commands need from the test: where to run, free ports, the lazily trained base."""

    workdir: Path
    pycache: Path
    base_policy: object  # () -> Path
    port: int = 29500
    fake_hub: Path | None = None


@define
class Command:
    source: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    kind: str  # train | dry_run | help | convert | uv | activate | refused
    timeout_s: float
    world: int | None = None
    args: list[str] = field(factory=list)  # lerobot-train / lerobot-convert-dcp flags, rewritten

    def flag(self, name: str) -> str | None:
        values = [a.split("=", 1)[1] for a in self.args if a.startswith(f"--{name}=")]
        return values[-1] if values else None


def _substitute(line: str, ctx: Context) -> str:
    line = re.sub(r"--dataset\.repo_id=\$\{HF_USER\}/[\w.-]+",
                  lambda _m: f"--dataset.repo_id=lerobot/demo_reach --dataset.root={DEMO}", line)
    line = re.sub(r"--policy\.path=\$\{HF_USER\}/[\w.-]+", lambda _m: f"--policy.path={ctx.base_policy()}", line)

    def which(m: re.Match) -> str:
        path = BIN / m.group(1)
        assert path.is_file(), f"$(which {m.group(1)}): not in the environment ({BIN})"
        return str(path)

    line = re.sub(r"\$\(which ([\w.-]+)\)", which, line)
    line = line.replace("${HF_USER}", "me").replace("${MAIN_NODE}", "127.0.0.1")
    assert "$" not in line.replace("\\$", ""), f"unknown placeholder or shell expansion in: {line}"
    return line


def _checkpoint_step(config_path: str, cwd: Path) -> int:
    p = (cwd / config_path).resolve()
    for d in (p, *p.parents):
        record = d / "training_state" / "training_step.json"
        if record.is_file():
            return json.loads(record.read_text())["step"]
    raise AssertionError(f"--config_path={config_path}: no checkpoint found above {p}")


def _train_args(args: list[str], spec: dict, cwd: Path) -> list[str]:
    if "--help" in args or "-h" in args:
        return args
    extra = list(TINY_RUN)
    if "--policy.type=act" in args:
        extra += TINY_ACT
    if spec.get("steps"):
        steps = int(spec["steps"])
    elif "--resume=true" in args:
        config = [a.split("=", 1)[1] for a in args if a.startswith("--config_path=")]
        assert config, "a --resume=true command needs --config_path"
        steps = _checkpoint_step(config[-1], cwd) + DEFAULT_STEPS
    else:
        steps = DEFAULT_STEPS
    return [*args, *extra, f"--steps={steps}"]


def _train_kind(args: list[str]) -> str:
    if "--help" in args or "-h" in args:
        return "help"
    return "dry_run" if "--dry_run=true" in args else "train"


def _split_launcher(tokens: list[str], what: str) -> tuple[list[str], str, list[str]]:
    for i, tok in enumerate(tokens):
        if not tok.startswith("-"):
            return tokens[:i], tok, tokens[i + 1:]
        assert "=" in tok or tok in ("--multi_gpu", "--use_fsdp", "--cpu", "--standalone"), \
            f"{what}: write launcher options as --name=value so the test can read them, got {tok!r}"
    raise AssertionError(f"{what}: no script after the launcher options")


def _opt(opts: list[str], *names: str) -> str | None:
    for o in opts:
        name, _, value = o.partition("=")
        if name in names:
            return value
    return None


def build_command(line: str, spec: dict, ctx: Context) -> Command:
    text = _substitute(line, ctx)
    tokens = shlex.split(text, comments=True)
    env = {}
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):
        k, _, v = tokens.pop(0).partition("=")
        env[k] = v
    if tokens[:2] == ["uv", "run"]:
        tokens = tokens[2:]
    assert tokens, f"empty command: {line}"
    prog, rest = tokens[0], tokens[1:]
    cwd = ctx.workdir
    name = Path(prog).name

    def script_command(script: str, args: list[str]) -> tuple[list[str], str]:
        assert Path(script).name == "lerobot-train", f"launchers here run lerobot-train, got {script!r}"
        return _train_args(args, spec, cwd), _train_kind(args)

    if name == "torchrun":
        opts, script, args = _split_launcher(rest, line)
        if _opt(opts, "--rdzv-endpoint", "--rdzv_endpoint") is not None:
            opts = [re.sub(r"^(--rdzv[-_]endpoint=[^:]+):\d+$", rf"\g<1>:{ctx.port}", o) for o in opts]
        else:
            opts = [*opts, f"--master-port={ctx.port}"]
        args, kind = script_command(script, args)
        world = int(_opt(opts, "--nproc-per-node", "--nproc_per_node") or 1) * int(_opt(opts, "--nnodes") or 1)
        argv = [PYTHON, "-m", "torch.distributed.run", *opts, str(BIN / "lerobot-train"), *args]
        return Command(line, argv, env, cwd, kind, LAUNCH_TIMEOUT_S, world, args)
    if name == "accelerate":
        assert rest[:1] == ["launch"], f"only `accelerate launch` is supported: {line}"
        opts, script, args = _split_launcher(rest[1:], line)
        if _opt(opts, "--main_process_port") is None:
            opts = [*opts, f"--main_process_port={ctx.port}"]
        else:
            opts = [re.sub(r"^--main_process_port=\d+$", f"--main_process_port={ctx.port}", o) for o in opts]
        args, kind = script_command(script, args)
        # no GPU is visible: without --multi_gpu accelerate starts a single process (its CPU rule)
        world = int(_opt(opts, "--num_processes") or 1) if "--multi_gpu" in opts else 1
        if "--use_fsdp" in opts:
            kind, world = "refused", None
        argv = [str(BIN / "accelerate"), "launch", *opts, str(BIN / "lerobot-train"), *args]
        return Command(line, argv, env, cwd, kind, LAUNCH_TIMEOUT_S, world, args)
    if name == "lerobot-train":
        args, kind = script_command(prog, rest)
        timeout = LAUNCH_TIMEOUT_S if kind == "train" else TOOL_TIMEOUT_S
        return Command(line, [str(BIN / "lerobot-train"), *args], env, cwd, kind, timeout, 1, args)
    if name == "lerobot-convert-dcp":
        kind = "help" if "--help" in rest else "convert"
        return Command(line, [str(BIN / "lerobot-convert-dcp"), *rest], env, cwd, kind, TOOL_TIMEOUT_S, None, rest)
    if name == "uv":
        assert rest[:1] == ["sync"], f"only `uv sync` is run from the guide: {line}"
        # --dry-run: never modify the (shared) environment; --locked: the lock file must already fit
        argv = [shutil.which("uv") or "uv", *rest, "--locked", "--dry-run", "--offline"]
        return Command(line, argv, env, REPO, "uv", TOOL_TIMEOUT_S)
    if prog in ("source", "."):
        assert len(rest) == 1, line
        activate = REPO / rest[0]
        if not activate.is_file():  # an environment outside the repository (UV_PROJECT_ENVIRONMENT)
            activate = BIN / "activate"
        argv = ["bash", "-c", f"source {shlex.quote(str(activate))} && command -v lerobot-train"]
        return Command(line, argv, env, REPO, "activate", TOOL_TIMEOUT_S)
    raise AssertionError(f"the guide shows a command this test cannot run: {line!r}")


def block_commands(block: Block, ctx: Context) -> list[Command]:
    body = block.body
    for rule in block.spec["replace"]:
        old, new = rule.split("=>", 1)
        assert old in body, f"{block.where()}: replace {old!r} matches nothing"
        body = body.replace(old, new)
    return [build_command(line, block.spec, ctx) for line in command_lines(body)]


# --------------------------------------------------------------------------------------------- running
def environment(ctx: Context, cmd: Command, needs_hub: bool) -> dict[str, str]:
    extra = {
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "CUDA_VISIBLE_DEVICES": "",  # CPU facts (accelerate's process count, gloo), also on a GPU machine
        "HF_HOME": str(ctx.workdir / "hf_home"),  # no user accelerate config, no Hub cache
        "HF_LEROBOT_HOME": str(ctx.workdir / "lerobot_home"),
        "HF_HUB_OFFLINE": "1",
        "TRACKIO_DIR": str(ctx.workdir / "trackio"),
        # compiled bytecode shared by every process of the session (PYTHONDONTWRITEBYTECODE may be set)
        "PYTHONDONTWRITEBYTECODE": "",
        "PYTHONPYCACHEPREFIX": str(ctx.pycache),
    }
    if needs_hub:
        extra["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ctx.fake_hub), os.environ.get("PYTHONPATH")]))
        extra["FAKE_HUB_LOG"] = str(ctx.workdir / "hub.jsonl")
    return {**extra, **cmd.env}


def run_block(block: Block, ctx: Context, launch) -> tuple[list[Command], list]:
    ctx.port = launch.free_port()
    commands = block_commands(block, ctx)
    if any(c.kind == "uv" for c in commands) and shutil.which("uv") is None:
        pytest.skip("uv is not installed here")
    needs_hub = "--policy.repo_id=" in block.body or "--push_to_hub=" in block.body
    run = [lambda c=c: launch.run_command(c.argv, timeout_s=c.timeout_s, env=environment(ctx, c, needs_hub),
                                          cwd=c.cwd) for c in commands]
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
        assert _expected_rc(block.spec, res.returncode), \
            f"{where}: `{cmd.source}` exit code {res.returncode}, expected {block.spec.get('rc', '0')}:\n" \
            + res.describe()
    output = "\n".join(r.output for r in results)
    succeeded = block.spec.get("rc", "0") == "0"
    # A concurrent block is one job (e.g. one command per node): its checks look at the joint output.
    jobs = ([(commands[0], output)] if block.spec.get("concurrent") == "true"
            else [(c, r.output) for c, r in zip(commands, results)])
    for cmd, out in jobs:
        if succeeded:
            check_command(cmd, out, ctx, where)
    for text in block.spec["expect"]:
        assert text in output, f"{where}: expected {text!r} in the output:\n" + "\n".join(
            r.describe() for r in results)
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
        assert '"dry_run": true' in out and "Sharding plan:" in out, f"{what}: no resolved config/plan:\n{out}"
    elif cmd.kind == "convert":
        assert "lerobot-convert-dcp: wrote " in out, f"{what}: no result line:\n{out}"
        repo = cmd.flag("push_to_hub")
        if repo:
            assert f"to https://hf.byter.me/{repo}" in out, f"{what}: no upload line:\n{out}"
            commits = [c for c in _hub_calls(ctx) if c["call"] == "create_commit" and c["repo_id"] == repo]
            assert commits and "model.safetensors" in commits[-1]["files"], f"{what}: nothing uploaded"
            assert not any("pytorch_model_fsdp_0" in f for f in commits[-1]["files"])
    elif cmd.kind == "train":
        assert f"world size {cmd.world};" in out, f"{what}: expected a world size of {cmd.world}:\n{out}"
        assert "Effective batch size: " in out and "\ncheckpoint: " in out, f"{what}: no banner/checkpoint:\n{out}"
        out_dir = cmd.flag("output_dir")
        if out_dir:
            last = ctx.workdir / out_dir / "checkpoints" / "last"
            assert (last / "training_state" / "training_step.json").is_file(), f"{what}: no checkpoint in {last}"
            assert (ctx.workdir / out_dir / "metrics.jsonl").is_file(), f"{what}: no metrics.jsonl"
        repo = cmd.flag("policy.repo_id")
        if repo and cmd.flag("policy.push_to_hub") not in ("false", "0"):
            assert f"published to {repo}" in out, f"{what}: not published:\n{out}"
            calls = [c for c in _hub_calls(ctx) if c["repo_id"] == repo]
            assert [c["call"] for c in calls][-2:] == ["create_repo", "create_commit"], calls
            assert {c["rank"] for c in calls} == {"0"}, f"{what}: a rank other than the main one uploaded"
        if cmd.flag("trackio.enable") == "true":
            project = cmd.flag("trackio.project") or cmd.flag("job_name")
            dbs = sorted(p.name for p in (ctx.workdir / "trackio").glob("*.db"))
            assert (f"{project}.db" in dbs) if project else dbs, f"{what}: trackio logged nothing ({dbs})"


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="session")
def guide_env(request, tmp_path_factory, launch):
    """Session-wide: the bytecode cache, the fake Hub, and a lazily trained base policy."""
    pycache = Path(request.config.cache.mkdir("guide-pycache"))
    fake = tmp_path_factory.mktemp("fake_hub")
    (fake / "sitecustomize.py").write_text(FAKE_HUB)
    cache: dict[str, Path] = {}

    def base_policy() -> Path:
        if "path" not in cache:
            work = tmp_path_factory.mktemp("base_policy")
            ctx = Context(work, pycache, base_policy, launch.free_port(), fake)
            cmd = build_command(
                "lerobot-train --dataset.repo_id=${HF_USER}/base_data --policy.type=act --output_dir=base", {},
                ctx)
            res = launch.run_command(cmd.argv, timeout_s=LAUNCH_TIMEOUT_S, env=environment(ctx, cmd, False),
                                     cwd=work)
            assert res.returncode == 0, res.describe()
            cache["path"] = work / "base" / "checkpoints" / "last" / "pretrained_model"
        return cache["path"]

    return pycache, fake, base_policy


# --------------------------------------------------------------------------------------------- tests
def test_every_guide_command_is_covered():
    """Every ```bash block is parsed, belongs to a chain that runs, and consists of runnable commands."""
    text = GUIDE.read_text()
    assert BLOCKS, "docs/guide.md has no ```bash block"
    fences = re.findall(r"^```bash", text, re.MULTILINE)
    assert len(BLOCKS) == len(fences), "a ```bash fence the parser did not take"
    assert not re.search(r"^```(sh|shell|console|zsh|shell-session)\b", text, re.MULTILINE), \
        "write commands in ```bash blocks (those are the ones this test runs)"
    ids = [b.id for b in BLOCKS]
    assert len(ids) == len(set(ids)), f"duplicate block ids: {ids}"
    ran = sorted(b.index for blocks in CHAINS.values() for b in blocks)
    assert ran == list(range(len(BLOCKS)))
    for name, blocks in CHAINS.items():  # a chain runs in document order, in one test
        assert [b.index for b in blocks] == sorted(b.index for b in blocks), name
    ctx = Context(Path("/nonexistent"), Path("/nonexistent"), lambda: Path("/base/pretrained_model"), 1, None)
    for b in BLOCKS:
        assert command_lines(b.body), f"{b.where()}: an empty block"
        # parse only (a resume's step count would come from a checkpoint that does not exist yet)
        for cmd in block_commands(Block(b.index, b.line, b.body, {"steps": "2", **b.spec}), ctx):
            assert cmd.argv and cmd.kind, cmd


def test_guide_covers_the_seed_guide():
    """The sections, flags and file names of the user's multi-GPU training guide are all documented."""
    text = GUIDE.read_text()
    for heading in ("## Installation", "## Launching", "### torchrun",
                    "### accelerate launch, as a plain launcher", "### CPU-only machines", "### Multi-node",
                    "## DDP", "## Batch size, learning rate and steps",
                    "## Sharded training (FSDP2)", "### Wrap units", "### Tied weights", "## HSDP", "## Precision",
                    "## PEFT (LoRA)", "## Checkpoints", "### Formats", "## Converting DCP checkpoints",
                    "## Resuming", "## Experiment tracking", "## Interrupts and failures", "## Notes"):
        assert re.search(rf"^{re.escape(heading)}$", text, re.MULTILINE), f"missing section {heading!r}"
    for needle in (
        "torchrun --nproc-per-node", "accelerate launch --num_processes", "--nnodes", "--node-rank",
        "--rdzv-endpoint", "--num_machines", "--machine_rank", "--main_process_ip", "--config_file",
        "LEROBOT_ALLOW_ACCELERATE_ENV=1", "--parallelism.dp_shard=-1", "--parallelism.dp_replicate",
        "--accelerator.gradient_accumulation.steps", "--optimizer.lr", "--steps", "--batch_size",
        "effective_batch_size = batch_size × dp_world_size × gradient_accumulation_steps",
        "_fsdp_wrap_modules", "--accelerator.fsdp.wrap_modules", "--accelerator.fsdp.min_num_params",
        "--accelerator.fsdp.reshard_after_forward", "--accelerator.fsdp.cpu_offload",
        "--accelerator.fsdp.ignored_modules", "--accelerator.fsdp.mixed_precision_policy", "param_dtype",
        "reduce_dtype", "output_dtype", "cast_forward_inputs", "--accelerator.mixed_precision", "bf16", "fp16",
        "--checkpoint_format", "safetensors_dcp", "pytorch_model_fsdp_0/", "optimizer_0/", "model.safetensors",
        "optimizer_state.safetensors", "optimizer_param_groups.json", "rng_state.safetensors",
        "scheduler_state.json", "scaler_state.json", "training_step.json", "train_config.json", "config.json",
        "policy_preprocessor.json", "policy_postprocessor.json", "lerobot-convert-dcp", "--dtype",
        "--delete_dcp", "--push_to_hub", "--overwrite", "--resume=true", "--config_path", "--trackio.enable",
        "--policy.repo_id", "--policy.path", "--job_name", "--output_dir", "0.6.x", "samples_per_s",
    ):
        assert needle in text, f"the guide does not mention {needle!r}"
    assert "](docs/guide.md)" in (REPO / "README.md").read_text(), "README.md does not link the guide"


@pytest.mark.slow
@pytest.mark.parametrize("chain", list(CHAINS), ids=list(CHAINS))
def test_guide_chain_runs(chain, guide_env, launch, tmp_path):
    pycache, fake, base_policy = guide_env
    ctx = Context(tmp_path, pycache, base_policy, 0, fake)
    for block in CHAINS[chain]:
        commands, results = run_block(block, ctx, launch)
        for cmd, res in zip(commands, results):
            print(f"[guide] {block.id}: {res.elapsed_s:5.1f} s  {cmd.source[:90]}")  # shown with -s
        check_block(block, ctx, commands, results)

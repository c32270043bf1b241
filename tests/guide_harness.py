"""The guide-test harness: parse ```bash blocks of docs/guide.md and rewrite them into tiny runnable commands.

Parsing (blocks, ``<!-- test: ... -->`` annotations, chains) and the generic rewriting rules described
in ``tests/test_guide_commands.py`` live here, so the test module keeps only what runs and checks them.
Loaded by path (``--import-mode=importlib`` keeps tests/ off ``sys.path``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sys
from collections import OrderedDict
from pathlib import Path

from attrs import define, field
from fastwam_flags import TINY_FASTWAM

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
DEMO = REPO / "data" / "lerobot" / "demo_reach"
BIN = Path(sys.executable).parent
PYTHON = sys.executable

DEFAULT_STEPS = 2
TINY_ACT = [
    "--policy.dim_model=32",
    "--policy.dim_feedforward=64",
    "--policy.n_heads=2",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.n_vae_encoder_layers=1",
    "--policy.chunk_size=5",
    "--policy.n_action_steps=5",
    "--policy.pretrained_backbone_weights=null",
]  # offline: no ImageNet download (LeRobot's default)
# pi0 / pi05 on the demo dataset at the README's tiny size, with the shipped byte-level tokenizer (offline)
TINY_VLA = [
    "--policy.paligemma_variant=gemma_tiny",
    "--policy.action_expert_variant=gemma_tiny",
    "--policy.vision_variant=tiny",
    "--policy.image_resolution=[56,56]",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
    f"--policy.tokenizer_name={REPO / 'data' / 'tokenizers' / 'demo_bytes'}",
]
# Diffusion Policy at the size of tests/test_diffusion_layouts.py (group norm: no ImageNet weights, offline)
TINY_DIFFUSION = [
    "--policy.pretrained_backbone_weights=null",
    "--policy.use_group_norm=true",
    "--policy.down_dims=[16,32]",
    "--policy.horizon=8",
    "--policy.n_action_steps=4",
    "--policy.spatial_softmax_num_keypoints=8",
    "--policy.diffusion_step_embed_dim=16",
    "--policy.num_train_timesteps=20",
    "--policy.scheduler_warmup_steps=0",
]
# FastWAM: TINY_FASTWAM (fastwam_flags.py), the guide's fastwam-tiny size, nothing read from the Hub cache
# SmolVLA at the guide's smolvla-tiny size, on the shipped tiny SmolVLM (tools/make_demo_vlm.py, offline)
TINY_SMOLVLA = [
    f"--policy.vlm_model_name={REPO / 'data' / 'vlms' / 'smolvlm_tiny'}",
    "--policy.num_vlm_layers=4",
    "--policy.resize_imgs_with_padding=[32,32]",
    "--policy.chunk_size=10",
    "--policy.n_action_steps=10",
]
# a full-size SmolVLA dry run reads only SmolVLM2-500M's config.json (a copy kept with the tests)
SMOLVLM2_CONFIG = (
    REPO / "packages" / "lerobot-cli" / "tests" / "data" / "smolvlm2_500m_video_instruct_config.json"
)
TINY_RUN = ["--num_workers=0", "--log_freq=1"]
LAUNCH_TIMEOUT_S = 240  # hard limit per command; the whole file takes ~2.5 min on 2 CPU cores
TOOL_TIMEOUT_S = 120
FAKE_HUB_DIR = Path(__file__).resolve().parent / "fake_hub"  # sitecustomize.py: Hub transport recorded

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
        above = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
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


# --------------------------------------------------------------------------------------------- commands
@define
class Context:
    """What a block's commands need from the test: where to run, free ports, the lazily trained base."""

    workdir: Path
    base_policy: object  # () -> Path
    port: int = 29500


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


def demo_with_camera(root: Path, camera: str) -> Path:
    """The demo dataset with its camera named ``camera`` instead of ``observation.images.top`` (written
    once into ``root``): ``meta/info.json``, ``meta/stats.json``, the episodes' columns and the video
    directory renamed, the frames the same. A ``--rename_map`` fine-tune of the base policy runs on it."""
    import pyarrow.parquet as pq

    if (root / "meta" / "info.json").is_file():
        return root
    old = "observation.images.top"
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(DEMO, tmp)
    (tmp / "videos" / old).rename(tmp / "videos" / camera)
    for name, section in (("info.json", "features"), ("stats.json", None)):
        file = tmp / "meta" / name
        data = json.loads(file.read_text())
        where = data[section] if section else data
        where[camera] = where.pop(old)
        file.write_text(json.dumps(data, indent=4))
    for file in (tmp / "meta" / "episodes").rglob("*.parquet"):
        table = pq.read_table(file)
        table = table.rename_columns([c.replace(f"/{old}/", f"/{camera}/") for c in table.column_names])
        meta = {k: v.replace(old.encode(), camera.encode()) for k, v in (table.schema.metadata or {}).items()}
        pq.write_table(table.replace_schema_metadata(meta), file)
    tmp.rename(root)
    return root


def demo_with_progress(root: Path) -> Path:
    """The demo dataset with a ``sarm_progress.parquet`` beside its ``meta/`` (LeRobot's RA-BC progress file,
    written once into ``root``): progress rising through even episodes and falling through odd ones, so
    ``--sample_weighting.type=rabc`` gives weights of 1 and 0."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if (root / "sarm_progress.parquet").is_file():
        return root
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(DEMO, tmp)
    columns, files = ["index", "episode_index", "frame_index"], sorted((tmp / "data").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f, columns=columns) for f in files])
    episode, frame = table.column("episode_index").to_numpy(), table.column("frame_index").to_numpy()
    progress = np.where(episode % 2 == 0, frame / 100.0, 1.0 - frame / 100.0).astype(np.float32)
    columns = {"index": table.column("index"), "episode_index": table.column("episode_index")}
    pq.write_table(pa.table({**columns, "progress_sparse": progress}), tmp / "sarm_progress.parquet")
    tmp.rename(root)
    return root


FRONT_CAMERA = "observation.images.front"


def _dataset(m: re.Match, ctx: Context) -> str:
    """A ``${HF_USER}`` dataset: the demo; one whose name has ``front`` in it: the demo with its camera
    named ``observation.images.front``; one with ``rabc``: the demo with a progress file (each written into
    the chain's work directory when it runs)."""
    if "rabc" in m.group(1):
        root = ctx.workdir / "demo_reach_rabc"
        if ctx.workdir.is_dir():
            demo_with_progress(root)
        return f"--dataset.repo_id=lerobot/demo_reach_rabc --dataset.root={root}"
    if "front" not in m.group(1):
        return f"--dataset.repo_id=lerobot/demo_reach --dataset.root={DEMO}"
    root = ctx.workdir / "demo_reach_front"
    if ctx.workdir.is_dir():
        demo_with_camera(root, FRONT_CAMERA)
    return f"--dataset.repo_id=lerobot/demo_reach_front --dataset.root={root}"


def _substitute(line: str, ctx: Context) -> str:
    line = re.sub(r"--dataset\.repo_id=\$\{HF_USER\}/([\w.-]+)", lambda m: _dataset(m, ctx), line)
    line = re.sub(
        r"--policy\.path=\$\{HF_USER\}/[\w.-]+", lambda _m: f"--policy.path={ctx.base_policy()}", line
    )

    def mixture(m: re.Match) -> str:  # a mixture of ${HF_USER} datasets: the demo dataset for each entry
        count = len(re.findall(r"\$\{HF_USER\}/[\w.-]+", m.group(0)))
        roots = ",".join([f'"{DEMO}"'] * count)
        return f"{m.group(0)} --dataset.root='[{roots}]'"

    line = re.sub(r"--dataset\.repo_id='\[[^\]]*\$\{HF_USER\}[^\]]*\]'", mixture, line)

    def which(m: re.Match) -> str:
        path = BIN / m.group(1)
        assert path.is_file(), f"$(which {m.group(1)}): not in the environment ({BIN})"
        return str(path)

    line = re.sub(r"\$\(which ([\w.-]+)\)", which, line)
    # the repository's bundled files (demo dataset, demo tokenizer),
    # named relative to its root as in the README
    line = re.sub(r"(--[\w.]+=)data/", lambda m: f"{m.group(1)}{REPO / 'data'}/", line)
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
    if "--policy.type=diffusion" in args:
        extra += TINY_DIFFUSION
    if ("--policy.type=pi0" in args or "--policy.type=pi05" in args) and "--dry_run=true" not in args:
        extra += TINY_VLA  # a dry run plans the full size on the meta device, in seconds
    fastwam = "--policy.type=fastwam" in args and "--policy.variant=tiny" not in args
    if fastwam and "--dry_run=true" not in args:
        extra += TINY_FASTWAM  # a full-size command, run tiny (its torch_dtype and layout flags kept)
    extra += _smolvla_args(args, cwd)
    if spec.get("steps"):
        steps = int(spec["steps"])
    elif "--resume=true" in args:
        config = [a.split("=", 1)[1] for a in args if a.startswith("--config_path=")]
        assert config, "a --resume=true command needs --config_path"
        steps = _checkpoint_step(config[-1], cwd) + DEFAULT_STEPS
    else:
        steps = DEFAULT_STEPS
    return [*args, *extra, f"--steps={steps}"]


def _smolvla_args(args: list[str], cwd: Path) -> list[str]:
    """A SmolVLA command that names no VLM (LeRobot's default, SmolVLM2-500M from the Hub) runs tiny on the
    shipped demo VLM; as a dry run it plans the full size from a copy of SmolVLM2-500M's config.json."""
    if "--policy.type=smolvla" not in args or any(a.startswith("--policy.vlm_model_name=") for a in args):
        return []
    if "--dry_run=true" not in args:
        return list(TINY_SMOLVLA)
    vlm = cwd / ".smolvlm2_500m"
    vlm.mkdir(parents=True, exist_ok=True)
    config = json.loads(SMOLVLM2_CONFIG.read_text())
    config.pop("_source", None)
    (vlm / "config.json").write_text(json.dumps(config))
    return [f"--policy.vlm_model_name={vlm}"]


def _train_kind(args: list[str]) -> str:
    if "--help" in args or "-h" in args:
        return "help"
    return "dry_run" if "--dry_run=true" in args else "train"


def _eval_kind(args: list[str]) -> str:
    return "help" if "--help" in args or "-h" in args else "eval"


def _split_launcher(tokens: list[str], what: str) -> tuple[list[str], str, list[str]]:
    for i, tok in enumerate(tokens):
        if not tok.startswith("-"):
            return tokens[:i], tok, tokens[i + 1 :]
        assert "=" in tok or tok in ("--multi_gpu", "--use_fsdp", "--cpu", "--standalone"), (
            f"{what}: write launcher options as --name=value so the test can read them, got {tok!r}"
        )
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
        launched = Path(script).name
        assert launched in ("lerobot-train", "lerobot-eval"), (
            f"launchers here run lerobot-train, got {script!r}"
        )
        if launched == "lerobot-eval":
            return args, _eval_kind(args)
        return _train_args(args, spec, cwd), _train_kind(args)

    if name == "torchrun":
        opts, script, args = _split_launcher(rest, line)
        if _opt(opts, "--rdzv-endpoint", "--rdzv_endpoint") is not None:
            opts = [re.sub(r"^(--rdzv[-_]endpoint=[^:]+):\d+$", rf"\g<1>:{ctx.port}", o) for o in opts]
        else:
            opts = [*opts, f"--master-port={ctx.port}"]
        args, kind = script_command(script, args)
        world = int(_opt(opts, "--nproc-per-node", "--nproc_per_node") or 1) * int(
            _opt(opts, "--nnodes") or 1
        )
        argv = [PYTHON, "-m", "torch.distributed.run", *opts, str(BIN / Path(script).name), *args]
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
    if name == "lerobot-eval":
        kind = _eval_kind(rest)
        return Command(line, [str(BIN / "lerobot-eval"), *rest], env, cwd, kind, LAUNCH_TIMEOUT_S, 1, rest)
    if name == "lerobot-convert-dcp":
        kind = "help" if "--help" in rest else "convert"
        return Command(
            line, [str(BIN / "lerobot-convert-dcp"), *rest], env, cwd, kind, TOOL_TIMEOUT_S, None, rest
        )
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
        # wandb's own folders (its cache, config, staged artifacts) in the workdir, never under ~
        **{f"WANDB_{n}_DIR": str(ctx.workdir / "wandb" / n.lower()) for n in ("CACHE", "CONFIG", "DATA")},
    }
    if needs_hub:
        # The fake Hub answers every request a publish makes (whoami, create_repo, create_commit);
        # offline mode would (rightly) make lerobot-train refuse --policy.repo_id at start-up.
        extra["HF_HUB_OFFLINE"] = "0"
        extra["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAKE_HUB_DIR), os.environ.get("PYTHONPATH")]))
        extra["FAKE_HUB_LOG"] = str(ctx.workdir / "hub.jsonl")
    return {**extra, **cmd.env}

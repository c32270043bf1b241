"""``lerobot-convert-dcp``: flags and their errors, the installed script end to end, its memory, the Hub push.

The Hub transport is faked at ``HfApi.create_repo`` / ``HfApi.create_commit``: the operations our
code builds are the exact upload, checked file by file.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from lerobot_ckpt import Parallelism, RunInfo, read_training_step
from lerobot_ckpt.convert.cli import main, parse_args
from lerobot_ckpt.state.record import Artifacts, TrainingStepRecord, write_record
from safetensors.torch import load_file

SCRIPT = str(Path(sys.executable).parent / "lerobot-convert-dcp")
PROG = "lerobot-convert-dcp: error: "

# DCP warns that it saves "in a single process" when no process group exists: that is the point here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make_checkpoint(root: Path, state=None) -> Path:
    step = root / "checkpoints" / "000010"
    pm, ts = step / "pretrained_model", step / "training_state"
    pm.mkdir(parents=True)
    ts.mkdir()
    state = (
        state
        if state is not None
        else {
            "enc.weight": torch.randn(7, 5),
            "enc.bias": torch.randn(7),
            "steps": torch.tensor([3], dtype=torch.int64),
        }
    )
    dcp.save({"model": state}, storage_writer=dcp.FileSystemWriter(pm / "pytorch_model_fsdp_0"), no_dist=True)
    for name in ("config.json", "train_config.json", "policy_preprocessor.json", "policy_postprocessor.json"):
        (pm / name).write_text("{}")
    for name in (
        "policy_preprocessor_step_0_normalizer.safetensors",
        "policy_postprocessor_step_0_unnormalizer.safetensors",
    ):
        (pm / name).write_bytes(b"")
    (pm / "notes.txt").write_text("mine, not for the Hub")
    run = RunInfo(world_size=2, batch_size=1, parallelism=Parallelism(1, 2), checkpoint_format="dcp")
    write_record(
        ts / "training_step.json",
        TrainingStepRecord.for_run(
            run, step=10, artifacts=Artifacts(model_dcp=True, optimizer_dcp=True), sampler={}, versions={}
        ),
    )
    return step


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--checkpoint_dir is required"),
        (
            ["--checkpoint_dir=x", "--dtype=int8"],
            "--dtype must be one of bfloat16, float16, float32, got 'int8'",
        ),
        (["--checkpoint_dir=x", "--dtype"], "--dtype needs a value: --dtype=..."),
        (
            ["--checkpoint_dir=x", "--delete_dcp=maybe"],
            "--delete_dcp takes true or false (also 1/0, yes/no, on/off), got 'maybe'",
        ),
        (["--checkpoint_dir=x", "--private=true"], "--private only applies together with --push_to_hub"),
        (
            ["--checkpoint_dir=x", "--push_to_hub=noslash"],
            "--push_to_hub must be a Hub repo id like user/name",
        ),
        (["--checkpoint_dir=x", "--frobnicate=1"], "unknown flag --frobnicate (see --help)"),
        (["x"], "unexpected argument 'x': flags are written --name=value"),
        (["--checkpoint_dir=x", "--checkpoint_dir=y"], "--checkpoint_dir is given twice"),
    ],
)
def test_usage_errors_exit_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(PROG + message) and err.endswith("\n") and err.count("\n") == 1


def test_every_boolean_spelling_accepted_is_the_one_the_error_lists(capsys):
    from lerobot_ckpt.convert import cli

    assert main(["--checkpoint_dir=x", "--overwrite=maybe"]) == 2
    listed = set(re.findall(r"\w+", capsys.readouterr().err.split("takes", 1)[1].split("got")[0]))
    for word in cli._TRUE + cli._FALSE:
        assert parse_args(["--checkpoint_dir=x", f"--overwrite={word.upper()}"]).overwrite is (
            word in cli._TRUE
        )
        assert word in listed, word


def test_flags_parse_in_lerobot_style():
    args = parse_args(
        [
            "--checkpoint_dir=a/b",
            "--dtype=float16",
            "--delete_dcp=true",
            "--push_to_hub=u/r",
            "--private",
            "--overwrite=false",
        ]
    )
    assert (
        args.checkpoint_dir,
        args.dtype,
        args.delete_dcp,
        args.push_to_hub,
        args.private,
        args.overwrite,
    ) == (Path("a/b"), "float16", True, "u/r", True, False)


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: lerobot-convert-dcp --checkpoint_dir=DIR")
    assert all(f"--{flag}" in out for flag in ("dtype", "delete_dcp", "push_to_hub", "private", "overwrite"))


def test_checkpoint_problems_exit_2_with_one_line(tmp_path, capsys):
    (tmp_path / "pretrained_model").mkdir()
    assert main([f"--checkpoint_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(PROG) and err.count("\n") == 1 and "--checkpoint_format=dcp" in err


def test_installed_script_usage_error_has_no_traceback():
    proc = subprocess.run(
        [SCRIPT, "--checkpoint_dir=somewhere", "--dtype=int8"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == PROG + "--dtype must be one of bfloat16, float16, float32, got 'int8'\n"


def test_installed_script_converts_casts_verifies_and_deletes(tmp_path):
    state = {"enc.weight": torch.randn(7, 5), "enc.bias": torch.randn(7), "steps": torch.tensor([3])}
    step = make_checkpoint(tmp_path, state)
    # stderr is a pipe (a log file, CI): no progress bar, even where colours are forced
    proc = subprocess.run(
        [SCRIPT, f"--checkpoint_dir={step}", "--dtype=bfloat16", "--delete_dcp=true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "FORCE_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert not any(c in proc.stderr for c in ("\r", "\x1b", "━")), repr(proc.stderr)
    weights = step / "pretrained_model" / "model.safetensors"
    assert proc.stdout.strip() == (
        f"lerobot-convert-dcp: wrote {weights} (3 tensors, 0.0 MB) in "
        f"{proc.stdout.split(' in ')[-1].split(' s;')[0]} s; verified and "
        "removed the DCP shards"
    )
    assert "warning: the fp32 master weights are gone" in proc.stderr  # a later resume is not exact
    out = load_file(weights)
    assert out["enc.weight"].dtype == torch.bfloat16 and torch.equal(
        out["enc.weight"], state["enc.weight"].bfloat16()
    )
    assert torch.equal(out["steps"], state["steps"])
    assert not (step / "pretrained_model" / "pytorch_model_fsdp_0").exists()
    art = read_training_step(step).artifacts
    assert art.model_safetensors and not art.model_dcp


def test_progress_on_a_non_terminal_is_a_plain_line_at_most_every_period():
    import io

    from lerobot_ckpt.convert.cli import _Lines
    from lerobot_ckpt.convert.merge import Progress

    now, stream = [0.0], io.StringIO()
    lines = _Lines(period_s=10, stream=stream, clock=lambda: now[0])
    for i, t in enumerate((1.0, 9.0, 12.0, 15.0, 23.0, 40.0), start=1):
        now[0] = t
        lines(Progress(i, 6, i * 2_000_000, 12_000_000, f"w{i}"))
    # at 12 s and 23 s; the last tensor is left to the summary line
    assert stream.getvalue() == (
        "lerobot-convert-dcp: merged 6.0/12.0 MB, 3/6 tensors\n"
        "lerobot-convert-dcp: merged 10.0/12.0 MB, 5/6 tensors\n"
    )


MEASURE = r"""
import sys
from pathlib import Path
# what the conversion imports (not torch), before the baseline
import rich.progress, lerobot_ckpt.convert.merge
from lerobot_ckpt.convert.cli import main

def status(field):
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

rss = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := current RSS
code = main(["--checkpoint_dir=" + sys.argv[1]])
print(code, status("VmHWM") - rss)
"""


def test_peak_memory_is_about_one_tensor_not_the_model(tmp_path):
    """A fresh process converts 8 × 8 MiB tensors; its RSS may grow by about one of them, not 64 MiB."""
    state = {f"layer{i}.weight": torch.full((1024, 2048), float(i)) for i in range(8)}
    step = make_checkpoint(tmp_path, state)
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, str(step)], capture_output=True, text=True, timeout=120, check=False
    )
    code, growth = map(int, proc.stdout.strip().splitlines()[-1].split())
    assert code == 0, proc.stderr
    largest = 8 * 2**20
    assert growth < 1.5 * largest + 8 * 2**20, f"grew {growth / 2**20:.1f} MiB converting a 64 MiB model"
    out = load_file(step / "pretrained_model" / "model.safetensors")
    assert [float(out[f"layer{i}.weight"][5, 7]) for i in range(8)] == [float(i) for i in range(8)]


@pytest.fixture
def fake_hub(monkeypatch):
    from huggingface_hub import HfApi

    calls = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, **kw: calls.append(("create_repo", kw)))
    monkeypatch.setattr(HfApi, "create_commit", lambda self, **kw: calls.append(("create_commit", kw)))
    return calls


def test_push_to_hub_uploads_the_converted_pretrained_model_and_never_shards(tmp_path, fake_hub, capsys):
    step = make_checkpoint(tmp_path)
    # our settings LeRobot's config.json cannot hold (pi0's vision_variant, tokenizer_name) travel with it
    (step / "pretrained_model" / "config_extensions.json").write_text('{"type": "pi0"}')
    assert main([f"--checkpoint_dir={step}", "--push_to_hub=user/policy", "--private=true"]) == 0
    (_, repo), (_, commit) = fake_hub
    assert repo == {"repo_id": "user/policy", "private": True, "exist_ok": True, "repo_type": "model"}
    ops = commit["operations"]
    assert [op.path_in_repo for op in ops] == [
        "config.json",
        "config_extensions.json",
        "model.safetensors",
        "policy_postprocessor.json",
        "policy_postprocessor_step_0_unnormalizer.safetensors",
        "policy_preprocessor.json",
        "policy_preprocessor_step_0_normalizer.safetensors",
        "train_config.json",
        "README.md",
    ]
    card = ops[-1].path_or_fileobj
    card = card.read() if hasattr(card, "read") else card
    assert b"lerobot-convert-dcp" in card and b"--policy.path=user/policy" in card
    assert all("pytorch_model_fsdp_0" not in str(op.path_or_fileobj) for op in ops)
    assert (step / "pretrained_model" / "pytorch_model_fsdp_0").is_dir()  # converting kept them
    assert "uploaded config.json, config_extensions.json, model.safetensors" in capsys.readouterr().out


def test_push_to_hub_keeps_an_existing_model_card_and_reports_transport_failures(
    tmp_path, fake_hub, monkeypatch, capsys
):
    from huggingface_hub import HfApi

    step = make_checkpoint(tmp_path)
    (step / "pretrained_model" / "README.md").write_text("# my card")
    assert main([f"--checkpoint_dir={step}", "--push_to_hub=user/policy"]) == 0
    ops = fake_hub[-1][1]["operations"]
    assert [op.path_in_repo for op in ops].count("README.md") == 1
    assert next(op for op in ops if op.path_in_repo == "README.md").path_or_fileobj == str(
        step / "pretrained_model" / "README.md"
    )
    assert fake_hub[0][1]["private"] is False

    def offline(self, **kw):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "create_commit", offline)
    capsys.readouterr()
    assert main([f"--checkpoint_dir={step}", "--push_to_hub=user/policy", "--overwrite=true"]) == 1
    last = capsys.readouterr().err.splitlines()[-1]  # after the progress display (on stderr too)
    assert last.startswith(
        PROG + "upload to user/policy failed (ConnectionError: Name or service not known); "
    )
    assert last.endswith("model.safetensors is written")
    assert json.loads((step / "pretrained_model" / "config.json").read_text()) == {}


# --- writes stay inside the checkpoint, and every refusal is one line (issue 31) ---


def _one_line(capsys, *expected: str) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(PROG) and err.count("\n") == 1, err
    assert all(text in err for text in expected), err
    return err


def _names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()}


def test_symlinks_planted_for_every_nearby_pid_are_never_written_through(tmp_path, capsys):
    """A checkpoint carrying a symlink under each staged name the converter could pick (its own pid
    among them): the conversion succeeds, writes nothing outside, and leaves the links as they were."""
    step = make_checkpoint(tmp_path / "ckpt")
    pm, ts = step / "pretrained_model", step / "training_state"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    outside = tmp_path / "outside_dir"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    pids = range(max(1, os.getpid() - 64), os.getpid() + 64)
    for pid in pids:
        (pm / f".model.safetensors.tmp-{pid}").symlink_to(victim)
        (ts / f".training_step.json.tmp-{pid}").symlink_to(victim)
        (pm / f".pytorch_model_fsdp_0.deleting-{pid}").symlink_to(outside)
    planted_pm, planted_ts = _names(pm) - {"pytorch_model_fsdp_0"}, _names(ts)

    assert main([f"--checkpoint_dir={step}", "--delete_dcp=true"]) == 0, capsys.readouterr().err
    assert victim.read_text() == "precious"
    assert _names(outside) == {"keep.txt"} and (outside / "keep.txt").read_text() == "keep"
    assert _names(pm) == planted_pm | {"model.safetensors"}  # the links untouched, no leftovers
    assert _names(ts) == planted_ts
    assert all((pm / f".model.safetensors.tmp-{pid}").is_symlink() for pid in pids)
    assert set(load_file(pm / "model.safetensors")) == {"enc.weight", "enc.bias", "steps"}
    art = read_training_step(step).artifacts
    assert art.model_safetensors and not art.model_dcp


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_that_is_a_directory_is_refused_in_one_line(tmp_path, capsys, overwrite):
    step = make_checkpoint(tmp_path)
    pm = step / "pretrained_model"
    (pm / "model.safetensors").mkdir()
    (pm / "model.safetensors" / "mine.txt").write_text("mine")
    before = _names(pm)
    assert main([f"--checkpoint_dir={step}", f"--overwrite={str(overwrite).lower()}"]) == 2
    _one_line(capsys, f"{pm / 'model.safetensors'} is a directory, not a file", "nothing was written")
    assert _names(pm) == before and (pm / "model.safetensors" / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("dangling", [False, True])
def test_an_output_that_is_a_symlink_is_refused_in_one_line(tmp_path, capsys, dangling):
    step = make_checkpoint(tmp_path / "ckpt")
    pm = step / "pretrained_model"
    victim = tmp_path / "victim.safetensors"
    if not dangling:
        victim.write_text("precious")
    (pm / "model.safetensors").symlink_to(victim)
    assert main([f"--checkpoint_dir={step}", "--overwrite=true"]) == 2
    _one_line(capsys, f"{pm / 'model.safetensors'} is a symlink (to {victim})")
    assert (pm / "model.safetensors").is_symlink()
    assert victim.read_text() == "precious" if not dangling else not victim.exists()


def test_a_symlinked_pretrained_model_is_refused_before_anything_is_written(tmp_path, capsys):
    """step/pretrained_model -> a directory elsewhere: the weights would be written there."""
    step = make_checkpoint(tmp_path / "ckpt")
    elsewhere = tmp_path / "elsewhere"
    (step / "pretrained_model").rename(elsewhere)
    (step / "pretrained_model").symlink_to(elsewhere)
    before = _names(elsewhere)
    assert main([f"--checkpoint_dir={step}"]) == 2
    _one_line(capsys, "pretrained_model is a symlink", "give the real path")
    assert _names(elsewhere) == before


def test_delete_dcp_on_a_symlinked_shard_directory_deletes_nothing(tmp_path, capsys):
    step = make_checkpoint(tmp_path / "ckpt")
    pm = step / "pretrained_model"
    shards = tmp_path / "other_run_shards"
    (pm / "pytorch_model_fsdp_0").rename(shards)
    (pm / "pytorch_model_fsdp_0").symlink_to(shards)
    before, shard_files = _names(pm), _names(shards)
    record = (step / "training_state" / "training_step.json").read_bytes()
    assert main([f"--checkpoint_dir={step}", "--delete_dcp=true"]) == 2
    _one_line(capsys, "pytorch_model_fsdp_0 is a symlink", "nothing was read or written")
    assert _names(pm) == before and _names(shards) == shard_files  # nothing written, nothing deleted
    assert (step / "training_state" / "training_step.json").read_bytes() == record


def test_a_tensor_named_like_the_safetensors_metadata_key_is_refused(tmp_path, capsys):
    step = make_checkpoint(tmp_path, {"__metadata__": torch.ones(2), "w": torch.ones(3)})
    before = _names(step / "pretrained_model")
    assert main([f"--checkpoint_dir={step}"]) == 2
    _one_line(capsys, "a tensor is named '__metadata__'", "nothing was written")
    assert _names(step / "pretrained_model") == before


def _limit_file_size() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))


NO_FALLOCATE = r"""
import errno, os, sys
def unsupported(*args):
    raise OSError(errno.EOPNOTSUPP, "not supported")
os.posix_fallocate = unsupported  # a file system without it: the file grows by ftruncate and pwrite
from lerobot_ckpt.convert.cli import entry_point
sys.argv[0] = "lerobot-convert-dcp"
entry_point()
"""


@pytest.mark.parametrize("fallocate", [True, False], ids=["fallocate", "no-fallocate"])
def test_a_file_size_limit_is_one_line_and_leaves_nothing_half_written(tmp_path, fallocate):
    """``ulimit -f``: the same path a full disk takes (the kernel refuses the write): one line naming
    the file, whether the space is reserved by fallocate or the file grows by ftruncate. (CPython
    ignores SIGXFSZ at start-up, so the limit gives EFBIG rather than killing the script.)"""
    step = make_checkpoint(tmp_path, {"w": torch.ones(64, 256)})  # 64 KiB > the 16 KiB limit
    pm = step / "pretrained_model"
    before = _names(pm)
    command = [SCRIPT] if fallocate else [sys.executable, "-c", NO_FALLOCATE]
    proc = subprocess.run(
        [*command, f"--checkpoint_dir={step}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_limit_file_size,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr == (
        f"{PROG}could not write {pm / 'model.safetensors'}: File too large (nothing was written; "
        "the checkpoint is unchanged)\n"
    )
    assert _names(pm) == before


@pytest.mark.parametrize(
    ("flag", "suggestion"),
    [
        ("--dtpye=bfloat16", "--dtype"),
        ("--delete_dpc=true", "--delete_dcp"),
        ("--checkpointdir=x", "--checkpoint_dir"),
    ],
)
def test_a_misspelt_flag_gets_did_you_mean(flag, suggestion, capsys):
    assert main(["--checkpoint_dir=x", flag] if "checkpointdir" not in flag else [flag]) == 2
    _one_line(capsys, f"unknown flag {flag.split('=')[0]}; did you mean {suggestion}?")


def test_flags_also_parse_as_flag_space_value():
    args = parse_args(
        ["--checkpoint_dir", "a/b", "--dtype", "float16", "--delete_dcp", "--overwrite", "false"]
        + ["--push_to_hub", "u/r", "--private", "TRUE"]
    )
    assert (args.checkpoint_dir, args.dtype, args.delete_dcp, args.overwrite) == (
        Path("a/b"),
        "float16",
        True,
        False,
    )
    assert (args.push_to_hub, args.private) == ("u/r", True)
    # a boolean takes only a boolean word from the next token: a path after it is still an error
    with pytest.raises(Exception, match="unexpected argument 'a/b'"):
        parse_args(["--delete_dcp", "a/b"])


def test_push_to_hub_refuses_a_symlinked_file_before_converting(tmp_path, fake_hub, capsys):
    """config.json -> a private file elsewhere: it would be published under the checkpoint's name."""
    step = make_checkpoint(tmp_path / "ckpt")
    pm = step / "pretrained_model"
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    (pm / "config.json").unlink()
    (pm / "config.json").symlink_to(secret)
    assert main([f"--checkpoint_dir={step}", "--push_to_hub=user/policy"]) == 2
    _one_line(capsys, f"{pm / 'config.json'} is a symlink (to {secret})", "nothing was uploaded")
    assert fake_hub == [] and not (pm / "model.safetensors").exists()


def test_a_last_pointer_leading_outside_checkpoints_is_not_converted_into(tmp_path, capsys):
    """checkpoints/last -> another run's step: converting `last` would write into that run."""
    elsewhere = make_checkpoint(tmp_path / "other_run")
    mine = tmp_path / "mine" / "checkpoints"
    mine.mkdir(parents=True)
    (mine / "last").symlink_to(elsewhere)
    before = _names(elsewhere / "pretrained_model")
    assert main([f"--checkpoint_dir={mine / 'last'}"]) == 2
    _one_line(capsys, f"{mine / 'last'} points to {elsewhere}", "not a step directory")
    assert _names(elsewhere / "pretrained_model") == before

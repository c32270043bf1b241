"""``lerobot-convert-dcp``: the console script around :func:`lerobot_ckpt.convert.merge.convert_dcp`.

Flags follow ``lerobot-train``'s style: ``--name=value`` or ``--name value``, a bare boolean flag
means true, and a misspelt flag gets a "did you mean" (lerobot-ckpt cannot import lerobot-cli, so
this small parser repeats its two rules). Usage mistakes and every problem the user
can fix (missing shards, an existing output, a full disk) end with exit code 2 and one line
``lerobot-convert-dcp: error: ...``, never a traceback. Nothing here imports torch, and neither
does a conversion without ``--dtype`` (see :mod:`lerobot_ckpt.convert.merge`): a CUDA build of torch
costs ~0.6 GB resident and seconds of start-up, more than the whole merge. torch is imported only
for a ``--dtype`` cast and for the rare chunk only ``torch.load`` can decode.
"""

from __future__ import annotations

import difflib
import sys
import time
from pathlib import Path

from attrs import define, field

from lerobot_ckpt.errors import CheckpointError

PROG = "lerobot-convert-dcp"
DTYPE_CHOICES = ("bfloat16", "float16", "float32")
HELP = f"""usage: {PROG} --checkpoint_dir=DIR [--dtype={{{",".join(DTYPE_CHOICES)}}}] [--delete_dcp=true]
                           [--push_to_hub=REPO_ID [--private=true]] [--overwrite=true]

Merge the DCP weight shards of a sharded LeRobot checkpoint (pretrained_model/pytorch_model_fsdp_0/)
into pretrained_model/model.safetensors (adapter_model.safetensors for a PEFT run), and the EMA
weights' shards of pretrained_model_ema/ (runs with --ema.enable=true) the same way. Runs offline in
one process, without GPU or process group; memory stays about one tensor, not the model.

  --checkpoint_dir=DIR     a checkpoint step directory (…/checkpoints/005000 or checkpoints/last)
                           or its pretrained_model/ directory (pretrained_model_ema/: that one alone)
  --dtype=DTYPE            cast floating-point weights to bfloat16, float16 or float32
                           (default: as stored, i.e. fp32 master weights)
  --delete_dcp=true        after the output is written and verified, remove the shard directory and
                           update training_step.json (the checkpoint stays resumable and loadable;
                           with a --dtype cast, resuming continues from the rounded weights)
  --push_to_hub=REPO_ID    upload the converted pretrained_model/ (weights, config and processor
                           files, a model card; never shards) to the Hub model repo REPO_ID
  --private=true           create the Hub repository as private
  --overwrite=true         replace an existing model.safetensors
  -h, --help               show this help and exit

Flags are written --name=value or --name value; a boolean flag alone means true.
"""
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_BOOLS = ("delete_dcp", "private", "overwrite")


class UsageError(Exception):
    """A command line we refuse before doing anything."""


def _one_of(choices):
    def check(inst, attribute, value) -> None:
        if value is not None and value not in choices:
            raise UsageError(f"--{attribute.name} must be one of {', '.join(choices)}, got {value!r}")

    return check


def _repo_id(inst, attribute, value) -> None:
    if value is not None and (value.count("/") != 1 or not all(value.split("/"))):
        raise UsageError(f"--push_to_hub must be a Hub repo id like user/name, got {value!r}")


@define(frozen=True, kw_only=True)
class ConvertArgs:
    checkpoint_dir: Path = field(converter=Path)
    dtype: str | None = field(default=None, validator=_one_of(DTYPE_CHOICES))
    delete_dcp: bool = False
    push_to_hub: str | None = field(default=None, validator=_repo_id)
    private: bool = False
    overwrite: bool = False

    def __attrs_post_init__(self) -> None:
        if self.private and self.push_to_hub is None:
            raise UsageError("--private only applies together with --push_to_hub")


_FIELDS = {a.name for a in ConvertArgs.__attrs_attrs__}


def _boolean(name: str, value: str | None) -> bool:
    if value is None or value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise UsageError(f"--{name} takes true or false (also 1/0, yes/no, on/off), got {value!r}")


def _unknown(name: str) -> UsageError:
    close = difflib.get_close_matches(name, sorted(_FIELDS), n=1, cutoff=0.6)
    hint = f"; did you mean --{close[0]}?" if close else " (see --help)"
    return UsageError(f"unknown flag --{name}{hint}")


def _takes_next(argv: list[str], i: int, name: str) -> bool:
    """Whether ``argv[i]`` is the value of the bare ``--name`` before it (``--name value``): anything
    that is not a flag, and for a boolean only a boolean word (``--delete_dcp DIR`` stays an error)."""
    if i >= len(argv) or argv[i].startswith("--") or argv[i] in ("-h",):
        return False
    return name not in _BOOLS or argv[i].lower() in _TRUE + _FALSE


def parse_args(argv: list[str]) -> ConvertArgs:
    values: dict[str, object] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--"):
            raise UsageError(f"unexpected argument {arg!r}: flags are written --name=value or --name value")
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name not in _FIELDS:
            raise _unknown(name)
        if name in values:
            raise UsageError(f"--{name} is given twice")
        if not eq and _takes_next(argv, i, name):
            value, eq = argv[i], "="
            i += 1
        if name in _BOOLS:
            values[name] = _boolean(name, value if eq else None)
        elif not eq or not value:
            raise UsageError(f"--{name} needs a value: --{name}=... or --{name} ...")
        else:
            values[name] = value
    if "checkpoint_dir" not in values:
        raise UsageError(
            "--checkpoint_dir is required (a checkpoint step directory or its pretrained_model/)"
        )
    return ConvertArgs(**values)


class _Lines:
    """Progress for a stderr that is not a terminal (a log file, a pipe, CI): a plain line at most
    every ``period_s``, never a redrawn bar, whose carriage returns and escape codes garble a log.
    A conversion shorter than the period prints nothing beyond the final summary on stdout."""

    def __init__(self, period_s: float = 10.0, stream=None, clock=time.monotonic) -> None:
        self.period_s, self.stream, self.clock = period_s, stream or sys.stderr, clock
        self.last = clock()

    def __call__(self, p) -> None:
        now = self.clock()
        if now - self.last < self.period_s or p.tensors_done >= p.tensors_total:
            return
        self.last = now
        print(
            f"{PROG}: merged {p.bytes_done / 1e6:.1f}/{p.bytes_total / 1e6:.1f} MB, "
            f"{p.tensors_done}/{p.tensors_total} tensors",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        pass


class _Bar:
    """rich progress (bytes and tensors) on a terminal's stderr, shown from the first merged tensor
    on, so that an error found while checking the shards prints alone."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("[bold]merging[/]"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[tensors]} tensors"),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            refresh_per_second=4,
            console=Console(stderr=True),
        )  # stdout keeps the one result line
        self.task = None

    def __call__(self, p) -> None:
        if self.task is None:
            self.progress.start()
            self.task = self.progress.add_task("", total=p.bytes_total, tensors="")
        self.progress.update(
            self.task,
            completed=p.bytes_done,
            tensors=f"{p.tensors_done}/{p.tensors_total}",
            description=p.name[-48:],
        )

    def close(self) -> None:
        if self.task is not None:
            self.progress.stop()


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def release_freed_tensors_to_the_os(threshold: int = 1 << 20) -> bool:
    """Make glibc serve every allocation ≥ ``threshold`` with its own mmap, returned to the OS on free.

    By default glibc raises that threshold each time such a block is freed (up to 32 MiB), after
    which freed chunk-sized blocks stay in the heap and fragment it: converting 8 × 8 MiB tensors
    then grew RSS by ~3 tensors instead of one. A fixed threshold keeps the peak at about one chunk.
    Process-wide, so only this console script sets it; False where the C library is not glibc.
    """
    import ctypes

    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):
        return False


def run(args: ConvertArgs) -> int:
    from lerobot_ckpt.convert.hub import push_to_hub, refuse_linked_files
    from lerobot_ckpt.convert.merge import convert_dcp, locate

    if args.push_to_hub:  # refused before the conversion writes anything
        refuse_linked_files(locate(args.checkpoint_dir).pretrained)
    release_freed_tensors_to_the_os()
    bar = _Bar() if sys.stderr.isatty() else _Lines()
    try:
        result = convert_dcp(
            args.checkpoint_dir,
            dtype=args.dtype,
            delete_dcp=args.delete_dcp,
            overwrite=args.overwrite,
            progress=bar,
        )
    finally:
        bar.close()
    extra = "; verified and removed the DCP shards" if result.deleted_dcp else ""
    for done in (result.ema, result):
        if done is not None:
            print(
                f"{PROG}: wrote {done.output} ({done.tensors} tensors, {done.bytes / 1e6:.1f} MB) "
                f"in {done.seconds:.1f} s{extra}"
            )
    if result.deleted_dcp and args.dtype not in (None, "float32"):
        print(
            f"{PROG}: warning: the fp32 master weights are gone; this checkpoint now holds {args.dtype} "
            "weights only, and a resume from it continues from the rounded values",
            file=sys.stderr,
        )
    if args.push_to_hub:
        try:
            uploaded = push_to_hub(
                locate(args.checkpoint_dir).pretrained, args.push_to_hub, private=args.private
            )
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 - network/auth failures: one line, the weights are written
            print(
                f"{PROG}: error: upload to {args.push_to_hub} failed ({type(exc).__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); "
                f"{result.output} is written",
                file=sys.stderr,
            )
            return 1
        print(f"{PROG}: uploaded {', '.join(uploaded)} to https://hf.byter.me/{args.push_to_hub}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(HELP, end="")
        return 0
    try:
        return run(parse_args(argv))
    except (UsageError, CheckpointError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def entry_point() -> None:
    sys.exit(main())

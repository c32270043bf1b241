r"""Check that our ``--sample_weighting.*`` (RA-BC) computes what LeRobot 0.6.1's does, bit for bit.

    uv run python tools/interop/sample_weighting_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Two interpreters, files between them (as pi0_lerobot_interop.py, whose tiny pi0 helpers it reuses):

1. ours-write     (our env)     a progress parquet as LeRobot's ``compute_rabc_weights`` writes it (index,
                                episode_index, progress_sparse/progress_dense in float32), made harder: rows
                                shuffled (the global stats are sums in row order), NaN progress values, frames
                                missing from the file (whole runs, an episode's last frames), negative and
                                tiny deltas. Every dataset frame (those the file lacks too) in shuffled
                                batches of 8. For each weighting of ``CONFIGS``: our global stats
                                (``get_stats``) and each batch's weights and stats. A tiny pi0 and a tiny pi05
                                (fp32, one camera; ``pi0_lerobot_interop``'s) saved as safetensors, one batch
                                whose frames get weight 1, a soft weight and 0, and its noise and time: our
                                ``forward(batch, reduction="none")`` per-sample losses, and the loss and
                                ``sample_weight_*`` values our hooks make of ``policy(batch)``.
2. lerobot-check  (LeRobot env) LeRobot's ``SampleWeightingConfig`` defaults; for each weighting its own
                                ``make_sample_weighter`` (``progress_path`` unset: found as
                                ``<dataset_root>/sarm_progress.parquet``) and ``RABCWeights`` on the same file
                                and batches; its tiny pi0 and pi05 load our files (strict) and run
                                ``forward(batch, reduction="none")`` and LeRobot's own ``update_policy`` with
                                that weighter (the weighted loss it backpropagates and the ``sample_weight_*``
                                outputs it logs), with the same noise and time.
3. compare        (our env)     config defaults equal; global stats, every batch's weights and stats, the
                                per-sample losses and the weighted loss: max |Δ| printed, tolerance 0.

Exit status 0 means every comparison held.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

TOLERANCE = 0.0  # the same formulas in the same dtypes and order: any difference is a bug
BATCH_SIZE = 8
EPISODE_LENGTHS = (37, 80, 12, 55, 64, 23)
# (name, head_mode, chunk_size, kappa, epsilon, extra_params)
CONFIGS = (
    ("defaults", "sparse", 4, 0.01, 1e-6, {}),
    ("dense-chunk50", "dense", 50, 0.01, 1e-6, {}),
    ("kappa0.05-fallback0.5", "sparse", 10, 0.05, 1e-6, {"fallback_weight": 0.5}),
    ("epsilon1e-3-chunk1", "sparse", 1, 0.002, 1e-3, {}),
)
PI0_CONFIG = "defaults"  # the weighting of the pi0/pi05 check: its chunk_size is the tiny policies' (4)
PI0_SEED = 0
# The policies with a per-sample loss this driver builds on both sides (_flavours); run fails first when the
# registry has another (a spec with per_sample_loss), so a new one is not silently left unchecked.
FLAVOURED = ("pi0", "pi05")


def write_progress(work: Path) -> tuple[Path, int]:
    """The progress parquet (see the module doc) as ``<work>/sarm_progress.parquet``; the dataset's frames."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    index, episode, sparse, dense = [], [], [], []
    start = 0
    for ep, length in enumerate(EPISODE_LENGTHS):
        steps = rng.normal(0.02, 0.03, length)  # mostly forward, some backward
        steps[rng.random(length) < 0.1] = 0.0  # stalls: deltas of 0 and in [0, kappa]
        progress = np.clip(np.cumsum(steps), 0, 1)
        for f in range(length):
            index.append(start + f)
            episode.append(ep)
            sparse.append(progress[f])
            dense.append(progress[f] + rng.normal(0, 0.01))
        start += length
    total = start
    keep = np.ones(total, dtype=bool)
    keep[40:46] = False  # a run of frames the file lacks (episode 1)
    keep[total - 3 :] = False  # the last episode's last frames
    sparse, dense = np.asarray(sparse, np.float32), np.asarray(dense, np.float32)
    sparse[rng.random(total) < 0.05] = np.nan  # frames compute_rabc_weights could not score
    dense[rng.random(total) < 0.05] = np.nan
    order = rng.permutation(np.flatnonzero(keep))
    table = pa.table(
        {
            "index": np.asarray(index, np.int64)[order],
            "episode_index": np.asarray(episode, np.int64)[order],
            "frame_index": (
                np.asarray(index) - np.repeat(np.cumsum((0, *EPISODE_LENGTHS[:-1])), EPISODE_LENGTHS)
            )[order].astype(np.int64),
            "progress_sparse": sparse[order],
            "progress_dense": dense[order],
        }
    )
    path = work / "sarm_progress.parquet"
    pq.write_table(table, path)
    return path, total


def batches_of(total: int) -> list[list[int]]:
    order = np.random.default_rng(3).permutation(total).tolist()
    return [order[i : i + BATCH_SIZE] for i in range(0, total, BATCH_SIZE)]


def _interop_pi0():
    import pi0_lerobot_interop as pi0  # sibling modules (tools/interop/ is first on sys.path)

    return pi0


def _flavours() -> dict:
    """pi0 and pi05 (``pi0_lerobot_interop.Flavour``): the policies with a per-sample loss."""
    import pi05_lerobot_interop as pi05

    flavours = {"pi0": _interop_pi0().PI0, "pi05": pi05.PI05}
    assert tuple(flavours) == FLAVOURED
    return flavours


def coverage_problems() -> list[str]:
    """A registered policy with a per-sample loss (its spec's ``per_sample_loss``) that ``FLAVOURED`` lacks,
    or one ``FLAVOURED`` names without one (our env: reads the registry)."""
    from lerobot_cli.policies import manifest

    with_loss = [name for name, meta in manifest.policies().items() if meta["per_sample_loss"]]
    problems = [
        f"policy {name!r} registered with a per-sample loss but has no flavour in FLAVOURED: add one"
        for name in with_loss
        if name not in FLAVOURED
    ]
    problems += [
        f"FLAVOURED names {name!r}, no registered policy with a per-sample loss"
        for name in FLAVOURED
        if name not in with_loss
    ]
    return problems


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _our_weighter(path: Path, total: int, config: tuple):
    from lerobot_cli.sample_weighting.config import SampleWeightingConfig
    from lerobot_cli.sample_weighting.weights import make_sample_weighter

    _, head_mode, chunk_size, kappa, epsilon, extra = config
    cfg = SampleWeightingConfig(head_mode=head_mode, kappa=kappa, epsilon=epsilon, extra_params=extra)
    return make_sample_weighter(
        cfg, chunk_size=chunk_size, device=torch.device("cpu"), path=path, num_frames=total
    )


def ours_write(work: Path) -> None:
    import attrs
    from lerobot_cli.sample_weighting.config import SampleWeightingConfig
    from lerobot_cli.sample_weighting.loss import weight_the_loss
    from safetensors.torch import save_file

    start = time.perf_counter()
    path, total = write_progress(work)
    batches = batches_of(total)
    out: dict = {"total": total, "batches": batches, "config_defaults": attrs.asdict(SampleWeightingConfig())}
    for config in CONFIGS:
        weighter = _our_weighter(path, total, config)
        runs = []
        for batch in batches:
            weights, stats = weighter.compute_batch_weights({"index": torch.tensor(batch)})
            runs.append({"weights": weights.tolist(), "stats": stats})
        out[config[0]] = {"global": weighter.get_stats(), "batches": runs}

    # the tiny pi0 and pi05: frames whose raw weights are 1, soft and 0
    pi0 = _interop_pi0()
    weighter = _our_weighter(path, total, next(c for c in CONFIGS if c[0] == PI0_CONFIG))
    raw = weighter.weights_of(weighter.deltas(np.arange(total)))
    picks = [
        int(np.flatnonzero(raw == 1.0)[0]),
        int(np.flatnonzero((raw > 0) & (raw < 1))[0]),
        int(np.flatnonzero(raw == 0)[0]),
    ]
    case = pi0.CASES[0]
    (work / "tiny_sizes.json").write_text(json.dumps(pi0._tiny_sizes()))
    inputs = pi0.make_inputs(case, 2)
    inputs["batch.index"] = torch.tensor(picks, dtype=torch.int64)
    save_file(inputs, str(work / "inputs.safetensors"))
    for name, flavour in _flavours().items():
        config_cls, policy_cls = pi0._import(flavour.ours_config), pi0._import(flavour.ours_policy)
        torch.manual_seed(PI0_SEED)
        policy = policy_cls(config_cls(**pi0.OURS_TINY, **pi0._our_features(case), dtype=case.dtype))
        pi0.perturb_constants(policy, 1)
        state = {k: v.detach().contiguous() for k, v in policy.state_dict().items()}
        save_file(state, str(work / f"{name}.safetensors"))
        policy.train()
        with torch.no_grad():
            per_sample, _ = policy.forward(
                pi0.batch_of(inputs), noise=inputs["noise"], time=inputs["time"], reduction="none"
            )
        weight_the_loss(policy, weighter)
        loss, info = policy(pi0.batch_of(inputs), noise=inputs["noise"], time=inputs["time"])
        out[name] = {
            "indices": picks,
            "raw_weights": raw[picks].tolist(),
            "per_sample": per_sample.tolist(),
            "loss": loss.item(),
            "info": info,
        }
    (work / "ours.json").write_text(json.dumps(out))
    print(
        f"[ours-write] {total} frames, {len(batches)} batches, {len(CONFIGS)} weightings; pi0/pi05 frames "
        f"{picks} "
        f"(raw weights {[round(w, 4) for w in raw[picks].tolist()]}) ({time.perf_counter() - start:.1f} s)"
    )


def _diff(a: list[float], b: list[float]) -> float:
    if len(a) != len(b):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def compare(work: Path) -> bool:
    ours = json.loads((work / "ours.json").read_text())
    theirs = json.loads((work / "lerobot.json").read_text())
    ok = True

    same = ours["config_defaults"] == theirs["config_defaults"]
    ok &= same
    print(f"[config] SampleWeightingConfig() ours {ours['config_defaults']} / LeRobot "
          f"{theirs['config_defaults']}: {'equal' if same else 'DIFFER'}")  # fmt: skip
    for name, *_ in CONFIGS:
        o, t = ours[name], theirs[name]
        global_equal = o["global"] == t["global"]
        stats_diff = max(abs(o["global"][k] - t["global"][k]) for k in ("delta_mean", "delta_std"))
        weights_diff = max(
            _diff(a["weights"], b["weights"]) for a, b in zip(o["batches"], t["batches"], strict=True)
        )
        stats_differ = sum(a["stats"] != b["stats"] for a, b in zip(o["batches"], t["batches"], strict=True))
        good = global_equal and weights_diff <= TOLERANCE and stats_differ == 0
        ok &= good
        print(
            f"[weights] {name:22s} global stats {'equal' if global_equal else 'DIFFER'} "
            f"(delta_mean {o['global']['delta_mean']:.6g}, delta_std {o['global']['delta_std']:.6g}, "
            f"{o['global']['num_frames']} frames; max|Δ| {stats_diff:.1e}); {len(o['batches'])} batches: "
            f"weights max|Δ| {weights_diff:.1e}, per-batch stats differing {stats_differ} -> "
            f"{'ok' if good else 'MISMATCH'}"
        )
        if not global_equal:
            print(f"    ours {o['global']}\n    LeRobot {t['global']}")
    for name in FLAVOURED:
        o, t = ours[name], theirs[name]
        per_sample = _diff(o["per_sample"], t["per_sample"])
        loss = abs(o["loss"] - t["loss"])
        info_equal = o["info"] == t["info"]
        good = t["load_ok"] and per_sample <= TOLERANCE and loss <= TOLERANCE and info_equal
        ok &= good
        print(
            f"[{name}] frames {o['indices']} (raw weights {[round(w, 4) for w in o['raw_weights']]}): "
            f"LeRobot loads our file {'strictly' if t['load_ok'] else 'NOT'}; per-sample losses "
            f"(reduction='none') max|Δ| {per_sample:.1e} (ours {[round(v, 6) for v in o['per_sample']]}); "
            f"weighted loss ours {o['loss']!r} LeRobot update_policy {t['loss']!r} |Δ| {loss:.1e}; "
            f"sample_weight_* "
            f"{'equal' if info_equal else 'DIFFER'} {o['info']} -> {'ok' if good else 'MISMATCH'}"
        )
        if not info_equal:
            print(f"    LeRobot's output_dict sample_weight_*: {t['info']}")
    return ok


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def lerobot_check(work: Path) -> bool:
    from lerobot.rewards.sarm.rabc import RABCWeights
    from lerobot.utils.sample_weighting import SampleWeightingConfig, make_sample_weighter

    start = time.perf_counter()
    ours = json.loads((work / "ours.json").read_text())
    path = work / "sarm_progress.parquet"
    out: dict = {"config_defaults": dataclasses.asdict(SampleWeightingConfig())}

    class Holder:  # what make_sample_weighter reads of a policy: config.chunk_size
        def __init__(self, chunk_size: int) -> None:
            self.config = type("C", (), {"chunk_size": chunk_size})()

    weighters = {}
    for name, head_mode, chunk_size, kappa, epsilon, extra in CONFIGS:
        if name == "defaults":  # the factory, progress_path found under the dataset root as a run does
            cfg = SampleWeightingConfig(type="rabc")
            weighter = make_sample_weighter(
                cfg, Holder(chunk_size), torch.device("cpu"), dataset_root=str(work)
            )
        else:
            weighter = RABCWeights(
                progress_path=path, chunk_size=chunk_size, head_mode=head_mode, kappa=kappa, epsilon=epsilon,
                device=torch.device("cpu"), **extra,
            )  # fmt: skip
        weighters[name] = weighter
        runs = []
        for batch in ours["batches"]:
            weights, stats = weighter.compute_batch_weights({"index": torch.tensor(batch)})
            runs.append({"weights": weights.tolist(), "stats": stats})
        out[name] = {"global": weighter.get_stats(), "batches": runs}

    for name, flavour in _flavours().items():
        out[name] = _lerobot_pi(work, name, flavour, weighters[PI0_CONFIG])
    (work / "lerobot.json").write_text(json.dumps(out))
    took = time.perf_counter() - start
    print(f"[lerobot-check] {len(CONFIGS)} weightings, pi0's and pi05's update_policy ({took:.1f} s)")
    return True


def _lerobot_pi(work: Path, name: str, flavour, weighter) -> dict:
    from accelerate import Accelerator
    from lerobot.scripts.lerobot_train import update_policy
    from lerobot.utils.logging_utils import AverageMeter, MetricsTracker
    from safetensors.torch import load_file

    pi0 = _interop_pi0()
    case = pi0.CASES[0]
    policy = pi0._lerobot_tiny(work, case, flavour, 100)
    try:
        policy.load_state_dict(load_file(str(work / f"{name}.safetensors")), strict=True)
        load_ok = True
    except RuntimeError as exc:
        print(f"[lerobot {name}] load_state_dict(strict=True) FAILED: {str(exc)[:1000]}")
        load_ok = False
    inputs = load_file(str(work / "inputs.safetensors"))
    model = policy.model
    model.sample_noise = lambda shape, device: inputs["noise"].clone()
    model.sample_time = lambda bsize, device: inputs["time"].clone()
    policy.train()
    with torch.no_grad():
        per_sample, _ = policy.forward(pi0.batch_of(inputs), reduction="none")
    meters = {
        name: AverageMeter(name, ":.3f") for name in ("loss", "grad_norm", "lr", "update_s", "dataloading_s")
    }
    tracker = MetricsTracker(BATCH_SIZE, 100, 2, meters, initial_step=0)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)
    tracker, output = update_policy(
        tracker, policy, pi0.batch_of(inputs), optimizer, 10.0, accelerator=Accelerator(cpu=True),
        sample_weighter=weighter,
    )  # fmt: skip
    return {
        "load_ok": load_ok,
        "per_sample": per_sample.tolist(),
        "loss": tracker.loss.val,
        "info": {k: float(v) for k, v in output.items() if k.startswith("sample_weight_")},
    }


# ---------------------------------------------------------------- driver


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="run", choices=["run", "lerobot-check"])
    parser.add_argument("dir", nargs="?", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--lerobot-python", default="/tmp/lerobot-venv/bin/python")
    args = parser.parse_args()
    torch.set_num_threads(min(4, torch.get_num_threads()))
    if args.mode == "lerobot-check":
        return 0 if lerobot_check(args.dir) else 1
    problems = coverage_problems()
    for line in problems:
        print(f"sample weighting interop: FAIL: {line}")
    if problems:
        return 1
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sample-weighting-interop-") as tmp:
        work = args.dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        ours_write(work)
        lerobot = subprocess.run(
            [args.lerobot_python, str(Path(__file__).resolve()), "lerobot-check", str(work)], check=False
        )
        ok = lerobot.returncode == 0 and (work / "lerobot.json").is_file() and compare(work)
    took = time.perf_counter() - start
    print(f"sample weighting interop with LeRobot 0.6.1: {'PASS' if ok else 'FAIL'} ({took:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

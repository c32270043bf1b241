"""Check that our pi05 and LeRobot 0.6.1's compute the same thing, both ways across model.safetensors.

pi0_lerobot_interop.py's cases, structure, helpers, tolerances and driver (imported from it), for pi05, in
two interpreters:

    uv run python tools/interop/pi05_lerobot_interop.py --lerobot-python /tmp/lerobot-venv/bin/python

1. ours-write     (our env)     full-size keys, shapes and bf16 dtypes (meta device); per case of
                                ``pi0.CASES`` (fp32 and bf16; one observation.images.* camera, or two cameras
                                named otherwise plus an empty camera; a prompt row of one token) a seeded tiny
                                pi05 (gemma_tiny, tiny SigLIP, 56x56, chunk 4, its adaptive norms' zero
                                ``dense`` weights made random) saved as model.safetensors, the batch, noise
                                and time, our per-element losses, loss, action chunk and every parameter's
                                gradient as reference. Also our default config.json, and the demo dataset
                                written by tools/make_demo_dataset.py with the frames its statistics were
                                computed from.
2. lerobot-check  (LeRobot env) LeRobot's full-size PI05Policy (bf16, meta device): same keys, shapes, dtypes.
                                LeRobot's config parser reads our default config.json and gets its own default
                                PI05Config. LeRobot's ``compute_episode_stats`` / ``aggregate_stats`` run on
                                the demo's frames and are compared with our meta/episodes and meta/stats.json:
                                quantiles within QUANTILE_ATOL, min/max/count within MINMAX_ATOL; mean/std
                                reported (below). Per case: its tiny PI05Policy loads our file strictly (every
                                key in LeRobot's dtype) and recomputes the reference; a seeded LeRobot tiny
                                pi05 is written with ``save_pretrained``.
3. ours-check     (our env)     each LeRobot directory through our ``--policy.path`` path (dataset check,
                                config, loader), same comparisons and tolerances (pi0_lerobot_interop.py's
                                module doc).

The state is not a model input in pi05 (the pre-processor writes it into the prompt), so the batch's
``observation.state`` reaches neither side's model. LeRobot 0.6.1's environment lacks the ``datasets``
package its ``lerobot.datasets`` imports, so its ``compute_stats.py`` is loaded by path, with
``io_utils.load_image_as_numpy`` (its only import from there) standing in for reading a frame from disk.

Statistics that predate the quantiles are unchanged here (existing datasets keep their bytes), and two of
them are computed differently by LeRobot 0.6.1: a camera's min/max are divided by 255 in float64 here and
in float32 there (1 float32 ulp apart), and mean/std here are numpy's (two-pass) while LeRobot 0.6.1 takes
them from its running sums, std = sqrt(E[x²] - E[x]²) in float32, which loses about 1e-4 on a column that is
constant within an episode (the demo's target position). They are reported, not compared.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types
from pathlib import Path

import numpy as np
import pi0_lerobot_interop as pi0

QUANTILE_ATOL = 1e-12  # the same estimator on the same data
MINMAX_ATOL = 1e-7  # a camera's min/max: /255 in float64 here, in float32 in LeRobot 0.6.1 (module doc)
PI05 = pi0.Flavour(
    "pi05",
    "lerobot_cli.policies.pi05.config:PI05Config",
    "lerobot_cli.policies.pi05.modeling:PI05Policy",
    "lerobot.policies.pi05.modeling_pi05",
    "PI05Policy",
    "lerobot.policies.pi05.configuration_pi05:PI05Config",
    False,
    813,
    4_143_404_816,
)  # LeRobot 0.6.1 pi05 at its default variants (issue 15)
REPO = Path(__file__).resolve().parents[2]
DEMO_EPISODES, DEMO_MAX_STEPS, DEMO_FPS = 30, 100, 10  # tools/make_demo_dataset.py's defaults


# ---------------------------------------------------------------- our side (imports lerobot_cli)


def _demo_frames(work: Path) -> None:
    """The demo dataset as the tool writes it,
    and each episode's columns as the writer computed its stats from."""
    sys.path.insert(0, str(REPO / "tools"))
    import make_demo_dataset as demo

    demo.build(work / "demo", num_episodes=DEMO_EPISODES, max_steps=DEMO_MAX_STEPS, fps=DEMO_FPS)
    rng, arrays, total = np.random.default_rng(0), {}, 0
    for episode in range(DEMO_EPISODES):
        frames = demo.simulate_episode(rng, DEMO_MAX_STEPS, camera=True).frames
        length = len(frames[demo.CAMERA])
        index = np.arange(length)
        frames.update(
            timestamp=(index / DEMO_FPS).astype(np.float32),
            frame_index=index,
            episode_index=np.full(length, episode),
            index=total + index,
            task_index=np.full(length, 0),
        )
        arrays.update({f"{episode}/{key}": value for key, value in frames.items()})
        total += length
    np.savez(work / "demo_frames.npz", **arrays)
    import pyarrow.parquet as pq  # LeRobot's environment has no pyarrow: its side reads this JSON instead

    rows = [
        row
        for path in sorted((work / "demo" / "meta" / "episodes").rglob("*.parquet"))
        for row in pq.read_table(path).to_pylist()
    ]
    merged = []
    for row in rows:
        per: dict = {}
        for column, value in row.items():
            if column.startswith("stats/"):
                _, key, name = column.split("/")
                per.setdefault(key, {})[name] = value
        merged.append(per)
    (work / "ours_episode_stats.json").write_text(json.dumps(merged))


def ours_write(work: Path) -> None:
    from lerobot_cli.policies.pi05.config import PI05Config
    from lerobot_cli.policies.serialization import policy_config_to_dict

    start = time.perf_counter()
    default = PI05Config(**pi0._our_features(pi0.CASES[0]))
    (work / "ours_default_config").mkdir(parents=True, exist_ok=True)
    (work / "ours_default_config" / "config.json").write_text(
        json.dumps(policy_config_to_dict(default), indent=4)
    )
    pi0.ours_write(work, PI05)
    _demo_frames(work)
    print(
        "[ours-write] wrote the default config, the demo dataset and its frames "
        f"({time.perf_counter() - start:.1f} s)"
    )


def ours_check(work: Path) -> tuple[bool, dict]:
    return pi0.ours_check(work, PI05)


# ---------------------------------------------------------------- LeRobot side (imports lerobot)


def lerobot_reads_our_config(work: Path) -> tuple[bool, dict]:
    """LeRobot's parser on our default config.json: its own default PI05Config, field for field."""
    import dataclasses

    from lerobot.configs.policies import PreTrainedConfig

    theirs = PreTrainedConfig.from_pretrained(str(work / "ours_default_config"))
    default = pi0._lerobot_config(pi0.CASES[0], PI05)
    differ = [
        f.name
        for f in dataclasses.fields(default)
        if f.name != "device" and getattr(theirs, f.name) != getattr(default, f.name)
    ]
    ok = type(theirs).__name__ == "PI05Config" and not differ
    print(
        f"[config] LeRobot read our default config.json as {type(theirs).__name__}; fields differing from "
        f"its default: {differ or 'none'} -> {'ok' if ok else 'MISMATCH'}"
    )
    return ok, {"class": type(theirs).__name__, "differ": differ}


def _lerobot_compute_stats():
    """LeRobot 0.6.1's datasets/compute_stats.py, loaded by path (see the module doc)."""
    import lerobot

    root = Path(lerobot.__file__).parent / "datasets"
    package = types.ModuleType("lerobot.datasets")
    package.__path__ = [str(root)]
    io_utils = types.ModuleType("lerobot.datasets.io_utils")
    # A "path" here is the frame itself (H, W, C) uint8: what LeRobot would read back from its PNG.
    io_utils.load_image_as_numpy = lambda frame, dtype, channel_first: (
        np.transpose(frame, (2, 0, 1)) if channel_first else frame
    ).astype(dtype)
    sys.modules.update({"lerobot.datasets": package, "lerobot.datasets.io_utils": io_utils})
    spec = importlib.util.spec_from_file_location("lerobot.datasets.compute_stats", root / "compute_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stats_diffs(ours: dict, theirs: dict) -> dict[str, float]:
    """Worst |Δ| per statistic kind (quantiles, min/max/count, mean/std) over every feature."""
    worst: dict[str, float] = {}
    for key, per in theirs.items():
        for name, value in per.items():
            if name not in ours.get(key, {}):
                worst["missing"] = worst.get("missing", 0.0) + 1.0
                continue
            ref, got = np.asarray(value, np.float64), np.asarray(ours[key][name], np.float64)
            diff = float(np.abs(got.reshape(ref.shape) - ref).max())
            kind = (
                "quantiles"
                if name.startswith("q")
                else "mean/std"
                if name in ("mean", "std")
                else "min/max/count"
            )
            worst[kind] = max(worst.get(kind, 0.0), diff)
    return worst


def lerobot_stats(work: Path) -> tuple[bool, dict]:
    """LeRobot's statistics of the demo's frames against what our writer stored."""
    compute = _lerobot_compute_stats()
    demo = work / "demo"
    features = json.loads((demo / "meta" / "info.json").read_text())["features"]
    frames = np.load(work / "demo_frames.npz")
    per_episode = []
    for episode in range(DEMO_EPISODES):
        data = {k.split("/", 1)[1]: frames[k] for k in frames.files if k.startswith(f"{episode}/")}
        camera = [k for k, ft in features.items() if ft["dtype"] == "video"]
        data.update({k: list(data[k]) for k in camera})  # LeRobot's episode buffer holds one image per frame
        per_episode.append(compute.compute_episode_stats(data, features))
    aggregated = compute.aggregate_stats(per_episode)
    ours_total = json.loads((demo / "meta" / "stats.json").read_text())
    ours_episodes = json.loads((work / "ours_episode_stats.json").read_text())
    figures = {"dataset": _stats_diffs(ours_total, aggregated), "episodes": {}}
    for ours, theirs in zip(ours_episodes, per_episode, strict=True):
        for kind, value in _stats_diffs(ours, theirs).items():
            figures["episodes"][kind] = max(figures["episodes"].get(kind, 0.0), value)
    ok = all(
        "missing" not in f
        and f.get("quantiles", 1.0) <= QUANTILE_ATOL
        and f.get("min/max/count", 1.0) <= MINMAX_ATOL
        for f in figures.values()
    )
    q01 = {k: np.round(np.asarray(aggregated[k]["q01"]), 6).tolist() for k in ("observation.state", "action")}
    print(
        f"[stats] LeRobot's compute_episode_stats/aggregate_stats on the demo's {DEMO_EPISODES} episodes vs "
        f"our files: dataset {figures['dataset']}, per episode (worst) {figures['episodes']}; q01 {q01} -> "
        f"{'ok' if ok else 'MISMATCH'}"
    )
    return ok, figures


def _config_and_stats(work: Path) -> tuple[bool, dict]:
    config_ok, config = lerobot_reads_our_config(work)
    stats_ok, stats = lerobot_stats(work)
    return config_ok and stats_ok, {
        "config": config,
        "stats": stats,
        "config_ok": config_ok,
        "stats_ok": stats_ok,
    }


def lerobot_check(work: Path) -> bool:
    return pi0.lerobot_check(work, PI05, extra=_config_and_stats)


# ---------------------------------------------------------------- driver


def print_report(lerobot: dict, ours: dict | None, ours_ok: bool) -> None:
    pi0.print_report(lerobot, ours, ours_ok, policy="pi05")
    extra = lerobot.get("extra", {})
    if "config" in extra:
        print(
            f"  config.json: LeRobot reads our default as its {extra['config']['class']}, fields differing "
            f"{extra['config']['differ'] or 'none'}: {'PASS' if extra.get('config_ok') else 'FAIL'}"
        )
    if "stats" in extra:
        data, episodes = extra["stats"]["dataset"], extra["stats"]["episodes"]
        nan = float("nan")
        print(
            f"  demo statistics vs LeRobot's compute_stats, max|Δ| dataset / episodes: quantiles "
            f"{data.get('quantiles', nan):.1e} / {episodes.get('quantiles', nan):.1e}, min/max/count "
            f"{data.get('min/max/count', nan):.1e} / {episodes.get('min/max/count', nan):.1e} "
            f"({'PASS' if extra.get('stats_ok') else 'FAIL'}); mean/std {data.get('mean/std', nan):.1e} / "
            f"{episodes.get('mean/std', nan):.1e} (reported, see the module doc)"
        )


if __name__ == "__main__":
    sys.exit(pi0.main("pi05", __file__, (ours_write, ours_check, lerobot_check, print_report)))

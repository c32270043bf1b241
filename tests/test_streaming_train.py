"""Streaming (``--dataset.streaming=true``) on two ranks from a loopback Hub (``tools/hub_server.py``, the
real huggingface_hub client pointed at it by ``HF_ENDPOINT``; it drops a connection now and then, which
the reader retries): every frame once per epoch across ranks and workers, exact resume, a resume on
another world size that neither repeats nor skips a frame, ``lerobot-train`` resuming a streamed run
bitwise under DDP and FSDP2, and a file the Hub keeps failing ending the run in one line."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot_cli.datasets.episode_reader import EpisodeReader
from lerobot_cli.datasets.streamed import StreamedDataset
from lerobot_cli.datasets.writer import EpisodeData, write_dataset
from lerobot_trainloop.streaming import StreamingDataSource, natural_share

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
JOB = HERE / "multiproc" / "streaming_epoch.py"
REPO_ID = "org/streamed"
_spec = importlib.util.spec_from_file_location("hub_server", HERE.parent / "tools" / "hub_server.py")
hub_server = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hub_server)
_spec = importlib.util.spec_from_file_location("policy_plugin_test", HERE / "test_policy_plugin.py")
policy_plugin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(policy_plugin)  # plugin_env: the tiny_resmlp test policy, which records indices
RUN_SEED = 1000  # lerobot-train's default --seed
SHAPE = [8, 12, 3]
LENGTHS = [13, 7, 22, 9, 17, 11, 5, 19, 8, 14]
BATCH, WORKERS, SEED, BUFFER = 4, 2, 7, 16  # as in streaming_epoch.py


def write(root: Path, camera: str = "observation.images.top", lengths=LENGTHS, base: int = 0) -> Path:
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": None},
        "action": {"dtype": "float32", "shape": [2], "names": None},
        camera: {"dtype": "video", "shape": SHAPE, "names": ["height", "width", "channels"]},
    }

    def episode(ep: int, length: int) -> EpisodeData:
        rng = np.random.default_rng(base + ep)
        t = np.arange(length, dtype=np.float32)
        return EpisodeData(
            task="reach" if ep % 2 else "grasp",
            frames={
                "observation.state": rng.normal(size=(length, 3)).astype(np.float32),
                "action": np.stack([t / length, -t / length], axis=1).astype(np.float32),
                camera: rng.integers(0, 250, (length, *SHAPE), dtype=np.uint8),
            },
        )

    return write_dataset(root, 10, features, (episode(e, n) for e, n in enumerate(lengths)))


@pytest.fixture(scope="module")
def dataset_root(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("streamed") / "data")


@pytest.fixture(scope="module")
def hub(dataset_root, tmp_path_factory):
    """The dataset on a loopback Hub that drops every 5th file request mid-body; the environment that
    points a launched job at it (and at an empty LeRobot cache, so nothing is read locally)."""
    server, url = hub_server.serve(dataset_root, REPO_ID, drop_every=5)
    home = tmp_path_factory.mktemp("home")
    env = {"HF_ENDPOINT": url, "HF_HOME": str(home / "hf"), "HF_LEROBOT_HOME": str(home / "lerobot")}
    yield server, url, env
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def epoch_job(launch, hub, tmp_path_factory):
    _, _, env = hub
    out = tmp_path_factory.mktemp("epoch")
    url = f"hf://datasets/{REPO_ID}"
    res = launch.torchrun(JOB, str(out), url, str(BATCH), str(WORKERS), nproc=2, timeout_s=180, env=env)
    assert not res.timed_out and res.returncode == 0, res.describe()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks, json.loads((out / "state_a.json").read_text())


def _by_reader(ranks: list[dict], parts: str) -> dict[int, list[int]]:
    """Every reader's handed-out frame indices, in order, over ``parts`` (e.g. "AB")."""
    out: dict[int, list[int]] = {}
    for record in ranks:
        for part in parts:
            for entry in record[part]:
                out.setdefault(entry["reader"], []).extend(entry["index"])
    return out


def _share_size(reader: int, readers: int) -> int:
    return sum(b - a for _, a, b in natural_share(LENGTHS, SEED, 0, reader, readers, True))


def test_every_frame_is_read_once_per_epoch_across_ranks_and_workers(epoch_job):
    ranks, _ = epoch_job
    readers = _by_reader(ranks, "AB")
    assert sorted(readers) == [0, 1, 2, 3]  # 2 ranks x 2 workers
    epoch0 = [i for g, seen in readers.items() for i in seen[: _share_size(g, 4)]]
    assert sorted(epoch0) == list(range(sum(LENGTHS)))
    # a reader's share is its own: no frame of epoch 0 comes from two readers
    assert all(len(seen) >= _share_size(g, 4) for g, seen in readers.items())


def test_a_resume_on_the_same_ranks_gives_the_same_batches_bit_for_bit(epoch_job):
    ranks, _ = epoch_job
    for record in ranks:
        assert record["notes"] == []
        assert record["C"] == record["B"]  # same readers, indices and tensor digests


def _epoch0_seen_in_a(ranks: list[dict]) -> list[int]:
    return [i for g, seen in _by_reader(ranks, "A").items() for i in seen[: _share_size(g, 4)]]


def test_a_resume_on_another_world_size_reads_the_rest_of_the_epoch_once(epoch_job, dataset_root):
    ranks, state_a = epoch_job
    seen = _epoch0_seen_in_a(ranks)
    assert len(set(seen)) == len(seen) and 0 < len(seen) < sum(LENGTHS)
    rest = sum(LENGTHS) - len(seen)
    dataset = StreamedDataset([EpisodeReader(dataset_root, return_uint8=True)])
    source = StreamingDataSource(
        dataset.read, dataset.lengths, BATCH, device=torch.device("cpu"), seed=SEED, buffer_size=BUFFER
    )  # one process, no worker: 1 reader instead of 4
    notes = source.load_state_dict(state_a)
    assert any("4 readers continue as 1" in n for n in notes), notes
    after: list[int] = []
    for batch in source:
        after += batch["index"].tolist()
        if len(after) >= rest:
            break
    source.close()
    assert sorted(seen + after[:rest]) == list(range(sum(LENGTHS)))


@pytest.fixture(scope="module")
def train_runs(launch, hub, dataset_root, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    env = {**hub[2], **policy_plugin.plugin_env(tmp / "site")}
    other = write(tmp / "other", camera="observation.images.front", lengths=[6, 9, 12, 7], base=100)
    base = [
        f"--dataset.repo_id={REPO_ID}",  # not in the LeRobot cache: streamed from the (loopback) Hub
        "--dataset.streaming=true",
        "--dataset.streaming_buffer_size=20",
        f"--num_workers={WORKERS}",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        f"--batch_size={BATCH}",
        "--log_freq=1",
    ]
    runs: dict[str, list[str]] = {}
    for layout, flags in (("ddp", []), ("fsdp", ["--parallelism.dp_shard=-1"])):
        runs[f"{layout}_full"] = [*base, *flags, "--steps=8", "--save_checkpoint=false"]
        runs[f"{layout}_half"] = [*base, *flags, "--steps=3"]  # odd: the second worker's batch is next
        runs[f"{layout}_resumed"] = [
            "--resume=true",
            f"--config_path={tmp / f'{layout}_half'}/checkpoints/000003/pretrained_model/train_config.json",
            "--steps=8",
        ]
    runs["mixture"] = [  # one dataset from the Hub, one from a local directory
        f'--dataset.repo_id=["{REPO_ID}","org/other"]',
        f'--dataset.root=[null,"{other}"]',
        '--dataset.rename_map=[{},{"observation.images.front":"observation.images.top"}]',
        "--dataset.streaming=true",
        "--num_workers=1",
        "--policy.type=mlp",
        "--policy.hidden_dim=32",
        f"--batch_size={BATCH}",
        "--steps=3",
        "--log_freq=1",
        "--save_freq=3",  # its train_config.json: the pinned revisions
    ]
    # every training sample's index, per rank, under DDP and FSDP2: one epoch of every reader and a bit
    share = max(sum(b - a for _, a, b in natural_share(LENGTHS, RUN_SEED, 0, g, 4, True)) for g in range(4))
    epoch_steps = WORKERS * (math.ceil(share / BATCH) + 1)
    for layout, flags in (("ddp", []), ("fsdp", ["--parallelism.dp_shard=-1"])):
        (tmp / f"{layout}_indices").mkdir()
        runs[f"{layout}_record"] = [
            *[f for f in base if not f.startswith("--policy.")],
            *flags,
            "--policy.type=tiny_resmlp",
            f"--policy.record_dir={tmp / f'{layout}_indices'}",
            f"--steps={epoch_steps}",
            "--save_checkpoint=false",
        ]
    items = [f if "--resume=true" in f else [*f, f"--output_dir={tmp / name}"] for name, f in runs.items()]
    outs = dict(zip(runs, launch.lerobot_train_runs(*items, nproc=2, env=env), strict=True))
    # the DDP run's step-3 checkpoint continued by one process: 4 readers become 1
    single = tmp / "single"
    outs["single"] = launch.lerobot_train_runs(
        [
            "--resume=true",
            f"--config_path={tmp / 'ddp_half'}/checkpoints/000003/pretrained_model/train_config.json",
            "--steps=6",
            f"--output_dir={single}",
        ],
        nproc=1,
        env=env,
    )[0]
    return tmp, outs


def _losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_a_resumed_streamed_run_logs_the_uninterrupted_losses_bitwise(train_runs, hub, layout):
    tmp, outs = train_runs
    full, resumed = _losses(tmp / f"{layout}_full"), _losses(tmp / f"{layout}_half")
    assert sorted(resumed) == list(range(1, 9))
    assert resumed == full
    assert all(math.isfinite(v) for v in full.values())
    source = f"hf://datasets/{REPO_ID} at {hub_server.DEFAULT_SHA}"
    assert f"Streaming from {source}: 4 readers (2 ranks x 2 workers)" in outs[f"{layout}_full"].stdout


def test_another_world_size_continues_the_stream_with_a_warning(train_runs):
    tmp, outs = train_runs
    text = outs["single"].stdout + outs["single"].stderr
    assert "the stream's 4 readers continue as 2 (1 rank x 2 workers)" in text
    assert max(_losses(tmp / "single")) == 6


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_lerobot_train_reads_every_frame_once_per_epoch(train_runs, layout):
    """The indices the policy got on each rank: batch k of rank r came from reader 2r + k % 2 (its two
    workers in turn), and each reader's first epoch is its share's size: together, every frame once."""
    tmp, _ = train_runs
    readers: dict[int, list[int]] = {}
    for rank in range(2):
        lines = (tmp / f"{layout}_indices" / f"rank{rank}.jsonl").read_text().splitlines()
        for k, line in enumerate(lines):
            readers.setdefault(2 * rank + k % 2, []).extend(json.loads(line))
    epoch0 = []
    for g, seen in readers.items():
        size = sum(b - a for _, a, b in natural_share(LENGTHS, RUN_SEED, 0, g, 4, True))
        assert len(seen) >= size
        epoch0 += seen[:size]
    assert sorted(epoch0) == list(range(sum(LENGTHS)))


def test_a_streamed_mixture_trains_on_both_datasets(train_runs):
    tmp, outs = train_runs
    out = outs["mixture"].stdout
    assert "Dataset: a mixture of 2 (concatenated: each frame once per epoch)" in out
    assert "Streaming: 2 readers (2 ranks x 1 worker)" in out
    assert sorted(_losses(tmp / "mixture")) == [1, 2, 3]
    records = [json.loads(line) for line in (tmp / "mixture" / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # every log step: both ranks' samples so far, per dataset (global batch 8)
        counts = [record[f"samples/{REPO_ID}"], record["samples/org/other"]]
        assert sum(counts) == 2 * BATCH * record["step"], record
    assert min(counts) > 0  # both datasets were read
    # the Hub dataset's branch was resolved once, for every rank, and saved with the run
    saved = json.loads((tmp / "mixture/checkpoints/000003/pretrained_model/train_config.json").read_text())
    assert json.loads(saved["dataset"]["revision"]) == [hub_server.DEFAULT_SHA, None]


def test_dropped_connections_were_retried_without_a_trace(train_runs, hub):
    _, url, _ = hub
    stats = json.load(urllib.request.urlopen(url + "/_stats"))
    assert stats["drops"] > 0  # every run above read through them and matched an uninterrupted run


def test_a_file_the_hub_keeps_failing_ends_the_run_in_one_line(launch, train_runs, hub):
    tmp, _ = train_runs
    server, _, env = hub
    checkpoint = tmp / "fsdp_half" / "checkpoints" / "000003"
    before = launch.tree_digest(checkpoint)
    server.fail_path = "videos/"  # every video request answered 500 from now on
    try:
        res = launch.run_command(
            [
                launch.LEROBOT_TRAIN,
                "--resume=true",
                f"--config_path={checkpoint}/pretrained_model/train_config.json",
                "--steps=8",
                f"--output_dir={tmp / 'failing'}",
            ],
            timeout_s=120,
            env=env,
        )
    finally:
        server.fail_path = None
    assert res.returncode == 2, res.describe()
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, res.stderr  # one line, no traceback
    assert errors[0].startswith(f"lerobot-train: error: cannot read hf://datasets/{REPO_ID}/videos/")
    assert re.search(r"after \d+ attempts: HTTP 500", errors[0]), errors[0]
    assert launch.tree_digest(checkpoint) == before  # the checkpoint it resumed from is untouched

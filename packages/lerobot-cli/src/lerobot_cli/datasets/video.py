"""Frames of the concatenated-episode mp4 files at requested timestamps, decoded with PyAV.

Containers stay open between items (opening an mp4 costs more than decoding a 64x64 frame) in a small
per-process LRU. The key includes the pid: a DataLoader worker forked after the parent opened a file must
not share the parent's demuxer state, so each process opens its own.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import BinaryIO, Protocol

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from lerobot_cli.datasets.errors import DatasetError

MAX_OPEN_PER_PROCESS = 32
DECODER_THREADS = 1
_open: OrderedDict[tuple[int, str], av.container.InputContainer] = OrderedDict()
_open_lock = threading.Lock()  # cameras decode on threads of their own (dataset.py); one file per thread
_reformatters: dict[tuple[int, int], VideoReformatter] = {}


def _new_lock_in_child() -> None:
    """A forked child (a DataLoader worker) starts with a free lock, whatever a thread of its parent held."""
    global _open_lock
    _open_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def _reformatter() -> VideoReformatter:
    """A reused converter: ``frame.to_ndarray(format="rgb24")`` builds a new swscale context per call,
    which costs ~2 ms even for a 64x64 frame, against ~0.03 ms when the context is kept. One per thread:
    a swscale context used by two threads at once crashes the process."""
    key = (os.getpid(), threading.get_ident())
    reformatter = _reformatters.get(key)
    if reformatter is None:
        reformatter = _reformatters[key] = VideoReformatter()
    return reformatter


class RemoteVideo(Protocol):
    """A video file read through a file object (a streamed dataset's: range reads, not a local path)."""

    def open(self) -> BinaryIO: ...


def _av_open(path: str | RemoteVideo) -> av.container.InputContainer:
    return av.open(path if isinstance(path, str) else path.open())


def _container(path: str | RemoteVideo) -> av.container.InputContainer:
    with _open_lock:
        return _open_container(path)


def _open_container(path: str | RemoteVideo) -> av.container.InputContainer:
    pid = os.getpid()
    key = (pid, str(path))
    container = _open.get(key)
    if container is not None:
        _open.move_to_end(key)
        return container
    try:
        container = _av_open(path)
    except (av.FFmpegError, OSError) as err:
        raise DatasetError(f"cannot open video file {path}: {err}") from err
    if not container.streams.video:
        container.close()
        raise DatasetError(f"video file {path} has no video stream")
    # One decoder thread: parallelism comes from DataLoader workers (one process each). A threaded
    # decoder (FFmpeg's default: as many threads as cores, frame threading) decodes frames ahead of
    # the one asked for and throws them away at the next seek; on LeRobot's AV1 (dav1d) at 480x640
    # that halved the frames/s of random access, even with a core to spare.
    container.streams.video[0].codec_context.thread_count = DECODER_THREADS
    _open[key] = container
    mine = [k for k in _open if k[0] == pid]
    if len(mine) > MAX_OPEN_PER_PROCESS:
        _open.pop(mine[0]).close()
    return container


def close_all() -> None:
    """Close this process's containers (others' entries are theirs to close)."""
    pid = os.getpid()
    with _open_lock:
        for key in [k for k in _open if k[0] == pid]:
            _open.pop(key).close()


def probe_video(path: str | RemoteVideo) -> tuple[int, int]:
    """(height, width) of the first video stream, opened and closed again (safe before forking)."""
    try:
        with _av_open(path) as container:
            if not container.streams.video:
                raise DatasetError(f"video file {path} has no video stream")
            ctx = container.streams.video[0].codec_context
            return ctx.height, ctx.width
    except (av.FFmpegError, OSError) as err:
        raise DatasetError(f"cannot open video file {path}: {err}") from err


def decode_frames(
    path: str | RemoteVideo, timestamps: Sequence[float], tolerance_s: float, what: str = ""
) -> np.ndarray:
    """uint8 (T, H, W, 3) RGB frames whose presentation times match ``timestamps`` within ``tolerance_s``.

    Seeks to the key frame at or before the first requested time and decodes forward to the last one, as
    LeRobot's pyav backend does; if the demuxer lands after the first requested frame it seeks further
    back. A requested time with no frame within tolerance is a DatasetError naming the file: it means
    meta/episodes' from_timestamp, the timestamp column and the video disagree.
    """
    want = np.asarray(timestamps, dtype=np.float64)
    first, last = float(want.min()), float(want.max())
    container = _container(path)
    reformatter = _reformatter()
    stream = container.streams.video[0]
    time_base = float(stream.time_base)
    found: list[np.ndarray | None] = [None] * len(want)
    best = np.full(len(want), np.inf)
    back = 0.0
    try:
        while True:
            target = max(0.0, first - back)
            container.seek(int(target / time_base), stream=stream, backward=True, any_frame=False)
            start = None
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                ts = frame.pts * time_base
                start = ts if start is None else start
                dist = np.abs(want - ts)
                hit = (dist < tolerance_s) & (dist < best)
                if hit.any():
                    array = reformatter.reformat(frame, format="rgb24").to_ndarray()
                    for i in np.flatnonzero(hit):
                        found[i] = array
                best = np.minimum(best, dist)
                # Reached the last wanted time: frames are 1/fps apart, far more than the tolerance,
                # so no later frame can match better (decoding one more would be wasted).
                if ts >= last - tolerance_s:
                    break
            if target == 0.0 or (start is not None and start <= first + tolerance_s):
                break
            back = max(2.0 * back, 1.0)  # landed past the first wanted frame (or the end): seek earlier
    except av.FFmpegError as err:
        raise DatasetError(f"cannot decode video file {path}{what}: {err}") from err
    missing = [i for i, f in enumerate(found) if f is None]
    if missing:
        i = missing[0]
        raise DatasetError(
            f"video file {path}{what}: no frame within {tolerance_s} s of t={want[i]:.6f} s (nearest decoded "
            f"frame is {best[i]:.6f} s away); meta/episodes from_timestamp + the timestamp column must match "
            "the frame times in the video"
        )
    return np.stack(found)  # type: ignore[arg-type]

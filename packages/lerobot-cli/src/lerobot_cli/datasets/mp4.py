"""Writing episode videos the way LeRobot does: one mp4 per episode, then stream-copied into shared files.

LeRobot encodes each episode separately (``g=2``, ``crf=30``, ``yuv420p``) and concatenates episode files
without re-encoding, recording where each episode starts (``from_timestamp``). Doing the same here gives
files with LeRobot's structure (every episode starts on a key frame) rather than one long re-encode.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np

VCODECS = ("h264", "hevc", "libsvtav1")  # LeRobot's accepted set


def encode_episode(frames: np.ndarray, fps: int, vcodec: str = "h264", g: int = 2, crf: int = 30) -> bytes:
    """uint8 (T, H, W, 3) RGB frames -> bytes of an mp4 holding them at ``fps``."""
    if vcodec not in VCODECS:
        raise ValueError(f"vcodec must be one of {VCODECS}, got {vcodec!r}")
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream(vcodec, rate=fps, options={"g": str(g), "crf": str(crf)})
        stream.pix_fmt = "yuv420p"
        stream.height, stream.width = frames.shape[1], frames.shape[2]
        for frame in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")))
        out.mux(stream.encode(None))
    return buffer.getvalue()


def duration_s(blob: bytes) -> float:
    """Duration of the video stream (what LeRobot adds up into from/to_timestamp)."""
    with av.open(io.BytesIO(blob)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / av.time_base)


class Mp4Concatenator:
    """Appends episode mp4s to one output file by copying packets with shifted timestamps."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._out = av.open(str(path), "w")
        self._stream = None
        self._last_dts: int | None = None
        self.duration = 0.0
        self.size = 0

    def append(self, blob: bytes) -> tuple[float, float]:
        """Add one episode; returns its (from_timestamp, to_timestamp) in this file."""
        start, length = self.duration, duration_s(blob)
        with av.open(io.BytesIO(blob)) as src:
            stream = src.streams.video[0]
            if self._stream is None:
                self._stream = self._out.add_stream_from_template(stream, opaque=True)
            shift = round(start / stream.time_base)
            for packet in src.demux(stream):
                if packet.size == 0:
                    continue
                packet.pts += shift
                packet.dts += shift
                if self._last_dts is not None and packet.dts <= self._last_dts:
                    # An episode without B-frame delay (e.g. 1 frame) followed by one with it would repeat
                    # a dts; bump it by one tick as ffmpeg's muxer does (pts, hence frame times, unchanged).
                    packet.dts = self._last_dts + 1
                self._last_dts = packet.dts
                packet.stream = self._stream
                self._out.mux(packet)
        self.duration = start + length
        self.size += len(blob)
        return start, self.duration

    def close(self) -> None:
        self._out.close()


def video_info(path: Path) -> dict:
    """The ``info`` LeRobot records under a video feature in info.json."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        info = {
            "video.height": stream.codec_context.height,
            "video.width": stream.codec_context.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.codec_context.pix_fmt,
            "video.is_depth_map": False,
            "video.fps": int(stream.base_rate),
            "video.channels": 3,
            "has_audio": bool(container.streams.audio),
        }
    return info

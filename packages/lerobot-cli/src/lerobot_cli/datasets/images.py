"""Encoded images (the ``image`` dtype) to and from bytes with PyAV's PNG / JPEG codecs.

LeRobot stores ``image`` features in parquet as HF ``datasets.Image`` structs ``{bytes, path}`` holding
PNG (or JPEG) files. PyAV is already a dependency for video, so it decodes these too and no Pillow is
needed.
"""

from __future__ import annotations

import av
import numpy as np

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8"


def decode_image(data: bytes) -> np.ndarray:
    """PNG/JPEG bytes -> uint8 (H, W, 3) RGB; ValueError (with the reason) for anything else."""
    if data.startswith(_PNG_MAGIC):
        codec = "png"
    elif data.startswith(_JPEG_MAGIC):
        codec = "mjpeg"
    else:
        raise ValueError("image bytes are neither PNG nor JPEG")
    try:
        # A fresh context per image (~50 us): a reused PNG decoder returns corrupt pixels for the 2nd image.
        frames = av.CodecContext.create(codec, "r").decode(av.Packet(data))
    except av.FFmpegError as err:
        raise ValueError(f"undecodable {codec} image ({err})") from err
    if len(frames) != 1:
        raise ValueError(f"{codec} image decoded to {len(frames)} frames")
    return frames[0].to_ndarray(format="rgb24")


def encode_png(image: np.ndarray) -> bytes:
    """uint8 (H, W, 3) RGB -> PNG file bytes (lossless, so a round trip is exact)."""
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"encode_png needs uint8 (H, W, 3), got {image.dtype} {image.shape}")
    ctx = av.CodecContext.create("png", "w")
    ctx.width, ctx.height, ctx.pix_fmt = image.shape[1], image.shape[0], "rgb24"
    packets = ctx.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24"))
    packets += ctx.encode(None)
    return b"".join(bytes(p) for p in packets)

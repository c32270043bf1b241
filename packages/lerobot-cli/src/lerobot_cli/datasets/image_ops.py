"""The image operations behind ``--dataset.image_transforms``, in plain torch (torchvision is not installable
next to this stack's torch).

Every function takes a float image ``[..., C, H, W]`` with values in [0, 1] (C is 1 or 3; any leading
dimensions: a camera's stacked history frames are one call) and returns a new tensor; the input is never
written to. Their definitions are the ones torchvision's ``transforms.v2.functional`` documents for float
images, and the arithmetic is ordered the way that gives the same float32 values, so that the interop check
(``tools/interop/image_transforms_lerobot_interop.py``) can compare LeRobot's outputs with ours exactly:

* brightness ``f``: ``x * f``, clamped to [0, 1];
* contrast ``f``: blend with the mean of the frame's grayscale (one mean per frame);
* saturation ``f``: blend with the pixel's grayscale; grayscale is ITU-R 601 luma,
  ``0.2989 R + 0.587 G + 0.114 B``; a blend is ``x * f + y * (1 - f)`` clamped to [0, 1];
* hue ``h`` in [-0.5, 0.5]: RGB → HSV, hue shifted by ``h`` modulo 1, HSV → RGB;
* sharpness ``f``: blend with a 3×3 smoothing (weights 1/13, centre 5/13) of the interior pixels (the
  one-pixel border is kept); images of 2 pixels or less in a dimension are returned as they are;
* affine: inverse-mapped sampling (nearest or bilinear) on the pixel grid centred on the image, with a
  rotation clockwise by ``angle`` degrees, an integer translation, a scale and a shear; pixels that map
  outside the image take ``fill``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

_LUMA = (0.2989, 0.587, 0.114)


def _channels(image: torch.Tensor, what: str) -> int:
    if image.ndim < 3 or image.shape[-3] not in (1, 3):
        raise ValueError(f"{what} takes [..., 1 or 3, H, W] images, got shape {tuple(image.shape)}")
    if not image.is_floating_point():
        raise ValueError(f"{what} takes float images in [0, 1], got {image.dtype}")
    return image.shape[-3]


def blend(image: torch.Tensor, other: torch.Tensor, factor: float) -> torch.Tensor:
    """``image * factor + other * (1 - factor)``, clamped to [0, 1]."""
    factor = float(factor)
    return image.mul(factor).add_(other, alpha=1.0 - factor).clamp_(0.0, 1.0)


def grayscale(image: torch.Tensor) -> torch.Tensor:
    """The luma of an RGB image, ``[..., 1, H, W]``."""
    red, green, blue = image.unbind(dim=-3)
    luma = red.mul(_LUMA[0]).add_(green, alpha=_LUMA[1]).add_(blue, alpha=_LUMA[2])
    return luma.unsqueeze(dim=-3)


def adjust_brightness(image: torch.Tensor, factor: float) -> torch.Tensor:
    _channels(image, "brightness")
    if factor < 0:
        raise ValueError(f"brightness factor must be >= 0, got {factor}")
    return image.mul(factor).clamp_(0.0, 1.0)


def adjust_contrast(image: torch.Tensor, factor: float) -> torch.Tensor:
    c = _channels(image, "contrast")
    if factor < 0:
        raise ValueError(f"contrast factor must be >= 0, got {factor}")
    gray = grayscale(image) if c == 3 else image
    return blend(image, gray.mean(dim=(-3, -2, -1), keepdim=True), factor)


def adjust_saturation(image: torch.Tensor, factor: float) -> torch.Tensor:
    c = _channels(image, "saturation")
    if factor < 0:
        raise ValueError(f"saturation factor must be >= 0, got {factor}")
    if c == 1:
        return image.clone()
    return blend(image, grayscale(image), factor)


def rgb_to_hsv(image: torch.Tensor) -> torch.Tensor:
    """RGB in [0, 1] → (hue in [0, 1), saturation, value), on dimension -3. A grey pixel (all channels
    equal) has hue and saturation 0."""
    red, green, _ = image.unbind(dim=-3)
    low, high = torch.aminmax(image, dim=-3)
    grey = high == low
    spread = high - low
    ones = torch.ones_like(high)
    saturation = spread / torch.where(grey, ones, high)
    # Each channel's distance below the maximum, in units of the spread (any finite value for grey pixels:
    # their hue terms below sum to a whole turn).
    divisor = torch.where(grey, ones, spread).unsqueeze_(dim=-3)
    dr, dg, db = ((high.unsqueeze(dim=-3) - image) / divisor).unbind(dim=-3)
    not_red = high != red
    is_green = high == green
    from_green = dr.add(2.0).sub_(db).mul_(is_green & not_red)
    from_red = db.sub_(dg).mul_(~not_red)
    from_blue = dg.add_(4.0).sub_(dr).mul_(not_red.logical_and_(is_green.logical_not_()))
    hue = from_red.add_(from_green).add_(from_blue)
    hue = hue.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0)
    return torch.stack((hue, saturation, high), dim=-3)


# For each sextant of the hue circle (columns), which of (v, p, q, t) is red, green and blue (rows).
_SEXTANTS = ((0, 2, 1, 1, 3, 0), (3, 0, 0, 2, 1, 1), (1, 1, 3, 0, 0, 2))


def hsv_to_rgb(image: torch.Tensor) -> torch.Tensor:
    hue, sat, val = image.unbind(dim=-3)
    scaled = hue.mul(6)
    sextant = torch.floor(scaled)
    frac = scaled.sub_(sextant)
    sextant = sextant.to(dtype=torch.int32)
    sat_frac = sat * frac
    unsat = 1.0 - sat
    q = (1.0 - sat_frac).mul_(val).clamp_(0.0, 1.0)
    t = sat_frac.add_(unsat).mul_(val).clamp_(0.0, 1.0)
    p = unsat.mul_(val).clamp_(0.0, 1.0)
    sextant.remainder_(6)
    vpqt = torch.stack((val, p, q, t), dim=-3)
    pick = torch.tensor(_SEXTANTS, dtype=torch.long, device=image.device)[:, sextant]
    if pick.ndim > 3:  # (3, *lead, H, W) → (*lead, 3, H, W)
        pick = pick.moveaxis(0, -3)
    return vpqt.gather(-3, pick)


def adjust_hue(image: torch.Tensor, factor: float) -> torch.Tensor:
    c = _channels(image, "hue")
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue factor must be in [-0.5, 0.5], got {factor}")
    if c == 1 or image.numel() == 0:
        return image.clone()
    hue, sat, val = rgb_to_hsv(image).unbind(dim=-3)
    hue = hue.add(factor).remainder_(1.0)
    return hsv_to_rgb(torch.stack((hue, sat, val), dim=-3))


def adjust_sharpness(image: torch.Tensor, factor: float) -> torch.Tensor:
    c = _channels(image, "sharpness")
    if factor < 0:
        raise ValueError(f"sharpness factor must be >= 0, got {factor}")
    height, width = image.shape[-2:]
    if image.numel() == 0 or height <= 2 or width <= 2:
        return image.clone()
    shape = image.shape
    flat = image.reshape(-1, c, height, width) if image.ndim > 4 else image
    edge, centre = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor(
        [[edge, edge, edge], [edge, centre, edge], [edge, edge, edge]], dtype=image.dtype, device=image.device
    ).expand(c, 1, 3, 3)
    out = flat.clone()
    smooth = F.conv2d(out, kernel, groups=c)
    inner = out[..., 1:-1, 1:-1]
    inner.add_(smooth.sub_(inner), alpha=1.0 - factor)  # inner * f + smooth * (1 - f)
    return out.clamp_(0.0, 1.0).reshape(shape)


def inverse_affine_matrix(
    centre: Sequence[float], angle: float, translate: Sequence[float], scale: float, shear: Sequence[float]
) -> list[float]:
    """The 2×3 matrix (row-major) taking an output pixel, in coordinates centred on the image, to the input
    pixel it samples: the inverse of (translate · rotate-and-shear · scale) about ``centre`` (also in
    centred coordinates)."""
    rot = math.radians(angle)
    sx, sy = math.radians(shear[0]), math.radians(shear[1])
    cx, cy = centre
    tx, ty = translate
    # The forward rotation-shear (without scale): [[a, b], [c, d]], determinant 1.
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty)
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty)
    m[2] += cx
    m[5] += cy
    return m


def _sampling_grid(theta: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``grid_sample``'s grid (normalised, align_corners=False) for the inverse map ``theta`` (1×2×3) in
    centred pixel coordinates."""
    dtype, device = theta.dtype, theta.device
    base = torch.empty(1, height, width, 3, dtype=dtype, device=device)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=device))
    ys = torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height, device=device)
    base[..., 1].copy_(ys.unsqueeze_(-1))
    base[..., 2].fill_(1)
    half = torch.tensor([0.5 * width, 0.5 * height], dtype=dtype, device=device)
    scaled = theta.transpose(1, 2).div_(half)
    return base.view(1, height * width, 3).bmm(scaled).view(1, height, width, 2)


def affine(
    image: torch.Tensor,
    angle: float,
    translate: Sequence[int],
    scale: float,
    shear: Sequence[float],
    interpolation: str = "nearest",
    fill: float | Sequence[float] | None = 0.0,
    center: Sequence[float] | None = None,
) -> torch.Tensor:
    c = _channels(image, "affine")
    if interpolation not in ("nearest", "bilinear"):
        raise ValueError(f"affine interpolation must be nearest or bilinear, got {interpolation!r}")
    shape = image.shape
    height, width = shape[-2:]
    if image.numel() == 0:
        return image.clone()
    flat = image.reshape(-1, c, height, width)
    centre = [0.0, 0.0] if center is None else [center[0] - width * 0.5, center[1] - height * 0.5]
    m = inverse_affine_matrix(centre, angle, [float(translate[0]), float(translate[1])], scale, shear)
    theta = torch.tensor(m, dtype=image.dtype, device=image.device).reshape(1, 2, 3)
    grid = _sampling_grid(theta, height, width).expand(flat.shape[0], -1, -1, -1)
    if fill is None:
        out = F.grid_sample(flat, grid, mode=interpolation, padding_mode="zeros", align_corners=False)
        return out.reshape(shape)
    # A channel of ones rides along: where it comes back below 1, the pixel saw outside the image.
    ones = torch.ones((flat.shape[0], 1, height, width), dtype=flat.dtype, device=flat.device)
    sampled = F.grid_sample(
        torch.cat((flat, ones), dim=1), grid, mode=interpolation, padding_mode="zeros", align_corners=False
    )
    out, inside = torch.tensor_split(sampled, indices=(-1,), dim=-3)
    inside = inside.expand_as(out)
    fills = [float(v) for v in fill] if isinstance(fill, Sequence) else [float(fill)]
    fill_img = torch.tensor(fills, dtype=out.dtype, device=out.device).view(1, -1, 1, 1)
    if interpolation == "nearest":
        out = torch.where(inside < 0.5, fill_img.expand_as(out), out)
    else:  # out * inside + fill * (1 - inside)
        out = out.sub_(fill_img).mul_(inside).add_(fill_img)
    return out.reshape(shape)

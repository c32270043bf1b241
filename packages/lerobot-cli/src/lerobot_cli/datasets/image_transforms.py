"""``--dataset.image_transforms.*``: LeRobot 0.6.1's image augmentation, drawn from an explicit generator.

The config is LeRobot's ``ImageTransformsConfig`` (same field names, defaults and meaning, ``tfs`` a dict of
``{weight, type, kwargs}``), and :class:`ImageTransforms` is LeRobot's ``ImageTransforms``: the transforms of
positive weight, of which ``min(max_num_transforms, count)`` are picked per call by a weighted draw without
replacement, applied in config order (``random_order=false``) or the drawn order. The types available here:
``ColorJitter``, ``SharpnessJitter``, ``RandomAffine`` and ``Identity`` (LeRobot's defaults use the first
three); LeRobot's others (its newer custom ones, the rest of torchvision's v2) are refused in one line.

Every random number comes from the ``torch.Generator`` passed in, drawn with the same torch calls in the same
order as torchvision's v2 transforms and LeRobot's ``RandomSubsetApply`` draw theirs from the global RNG: with
``torch.manual_seed(s)`` on LeRobot's side and ``torch.Generator().manual_seed(s)`` here, the same transforms
with the same parameters are applied (``tools/interop/image_transforms_lerobot_interop.py`` checks it).
The module imports torch only when a transform runs: the config (and the validation of every entry's
kwargs) is read by the CLI before torch is loaded. Training seeds one generator per sample
(:func:`sample_generator`), so the draws depend on the run's seed and the sample's place in the data order
only: a resume draws what the uninterrupted run drew, and ranks and DataLoader workers draw independently.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrs import define, field

if TYPE_CHECKING:
    import torch

FLAG = "--dataset.image_transforms"
_TFS = f"{FLAG}.tfs"


def _frozen(value: Any) -> Any:
    """JSON lists as tuples, recursively, so a config read back from ``train_config.json`` equals the one
    that wrote it."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


def _kwargs(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{_TFS}: an entry's kwargs must be a JSON object, got {value!r}")  # noqa: TRY004
    return {str(k): _frozen(v) for k, v in value.items()}


@define(frozen=True)
class ImageTransformConfig:
    """One transform: ``weight`` its chance to be picked (normalised over the entries; 0: never),
    ``type`` its class, ``kwargs`` its arguments (ranges its parameters are drawn from)."""

    weight: float = field(default=1.0, metadata={"help": "Relative chance to be picked (0: never)."})
    type: str = field(
        default="Identity", metadata={"help": "ColorJitter, SharpnessJitter, RandomAffine, Identity."}
    )
    # Any, not dict[str, Any]: the converter checks it, so a non-object gets this module's sentence.
    kwargs: Any = field(factory=dict, converter=_kwargs)


def _default_tfs() -> dict[str, ImageTransformConfig]:
    return {
        "brightness": ImageTransformConfig(1.0, "ColorJitter", {"brightness": (0.8, 1.2)}),
        "contrast": ImageTransformConfig(1.0, "ColorJitter", {"contrast": (0.8, 1.2)}),
        "saturation": ImageTransformConfig(1.0, "ColorJitter", {"saturation": (0.5, 1.5)}),
        "hue": ImageTransformConfig(1.0, "ColorJitter", {"hue": (-0.05, 0.05)}),
        "sharpness": ImageTransformConfig(1.0, "SharpnessJitter", {"sharpness": (0.5, 1.5)}),
        "affine": ImageTransformConfig(
            1.0, "RandomAffine", {"degrees": (-5.0, 5.0), "translate": (0.05, 0.05)}
        ),
    }


@define(frozen=True)
class ImageTransformsConfig:
    """LeRobot's image augmentation of training frames (every camera, after decoding; never the held-out
    ``--dataset.eval_split`` frames)."""

    enable: bool = field(
        default=False,
        metadata={"help": "Augment the training frames of every camera (LeRobot's image_transforms)."},
    )
    max_num_transforms: int = field(
        default=3,
        metadata={"help": "Transforms applied per camera frame, picked by weight without replacement."},
    )
    random_order: bool = field(
        default=False, metadata={"help": "Apply the picked transforms in a random order (else tfs order)."}
    )
    tfs: dict[str, ImageTransformConfig] = field(
        factory=_default_tfs,
        metadata={
            "help": "The transforms, a JSON object {name: {weight, type, kwargs}} that replaces the "
            'defaults, e.g. \'{"brightness":{"weight":1.0,"type":"ColorJitter",'
            '"kwargs":{"brightness":[0.8,1.2]}}}\'.'
        },
    )

    def __attrs_post_init__(self) -> None:
        for name in ("enable", "random_order"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{FLAG}.{name} must be true or false, got {getattr(self, name)!r}")  # noqa: TRY004
        n = self.max_num_transforms
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(
                f"{FLAG}.max_num_transforms must be a whole number >= 0 (at most that many of the "
                f"tfs apply per frame; 0: none), got {n!r}"
            )
        if not isinstance(self.tfs, Mapping):
            raise ValueError(f"{_TFS} must be a JSON object {{name: {{weight, type, kwargs}}}}")  # noqa: TRY004
        for name, tf in self.tfs.items():
            w = tf.weight
            if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or w < 0:
                raise ValueError(f"{_TFS}: {name!r} has weight {w!r}; a weight is a finite number >= 0")
            make_transform(tf, name)  # type and kwargs: one sentence naming the entry

    def build(self) -> ImageTransforms:
        return ImageTransforms(self)


# ------------------------------------------------------------------------------------------ the transforms
def _uniform(low: float, high: float, generator: torch.Generator) -> float:
    import torch

    return torch.empty(1).uniform_(low, high, generator=generator).item()


class Identity:
    """Returns the frame as it is (draws nothing)."""

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return image


def _jitter_range(value, name: str, center: float, bound: tuple[float, float], clip_low: bool):
    """A factor range as ColorJitter reads it: a number ``v`` is ``[center - v, center + v]`` (clipped at 0
    when ``clip_low``), a pair is ``[lo, hi]`` within ``bound``; None when it changes nothing."""
    if value is None:
        return None
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"{name}: a single number must be >= 0, got {value}")
        lo, hi = center - float(value), center + float(value)
        if clip_low:
            lo = max(lo, 0.0)
    elif isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        lo, hi = (float(v) for v in value)
    else:
        raise ValueError(f"{name} must be a number or a pair [min, max], got {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ValueError(f"{name} must satisfy {bound[0]} <= min <= max <= {bound[1]}, got [{lo}, {hi}]")
    return None if lo == hi == center else (lo, hi)


class ColorJitter:
    """torchvision v2's ColorJitter: the order of the four adjustments is a random permutation, then a
    factor is drawn for each one given (brightness, contrast, saturation, hue in that order)."""

    def __init__(self, brightness=0, contrast=0, saturation=0, hue=0) -> None:
        inf = float("inf")
        self.brightness = _jitter_range(brightness, "brightness", 1.0, (0.0, inf), True)
        self.contrast = _jitter_range(contrast, "contrast", 1.0, (0.0, inf), True)
        self.saturation = _jitter_range(saturation, "saturation", 1.0, (0.0, inf), True)
        self.hue = _jitter_range(hue, "hue", 0.0, (-0.5, 0.5), False)

    def make_params(self, generator: torch.Generator) -> dict[str, Any]:
        import torch

        order = torch.randperm(4, generator=generator).tolist()
        factors = [
            None if r is None else _uniform(r[0], r[1], generator)
            for r in (self.brightness, self.contrast, self.saturation, self.hue)
        ]
        return {"order": order, "factors": factors}

    def apply(self, image: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        from lerobot_cli.datasets import image_ops

        ops = (
            image_ops.adjust_brightness,
            image_ops.adjust_contrast,
            image_ops.adjust_saturation,
            image_ops.adjust_hue,
        )
        for i in params["order"]:
            if params["factors"][i] is not None:
                image = ops[i](image, params["factors"][i])
        return image

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.apply(image, self.make_params(generator))


class SharpnessJitter:
    """LeRobot's SharpnessJitter: a sharpness factor drawn uniformly from ``[max(0, 1 - s), 1 + s]`` (or the
    pair given), then the sharpness adjustment (0: smoothed, 1: unchanged, 2: twice as sharp)."""

    def __init__(self, sharpness) -> None:
        if isinstance(sharpness, numbers.Number) and not isinstance(sharpness, bool):
            if sharpness < 0:
                raise ValueError(f"sharpness: a single number must be >= 0, got {sharpness}")
            lo, hi = max(1.0 - sharpness, 0.0), 1.0 + sharpness
        elif isinstance(sharpness, Sequence) and not isinstance(sharpness, str) and len(sharpness) == 2:
            lo, hi = (float(v) for v in sharpness)
        else:
            raise ValueError(f"sharpness must be a number or a pair [min, max], got {sharpness!r}")
        if not 0.0 <= lo <= hi:
            raise ValueError(f"sharpness must satisfy 0 <= min <= max, got [{lo}, {hi}]")
        self.sharpness = (float(lo), float(hi))

    def make_params(self, generator: torch.Generator) -> dict[str, Any]:
        return {"factor": _uniform(self.sharpness[0], self.sharpness[1], generator)}

    def apply(self, image: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        from lerobot_cli.datasets import image_ops

        return image_ops.adjust_sharpness(image, params["factor"])

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.apply(image, self.make_params(generator))


_INTERPOLATIONS = {"nearest": "nearest", "bilinear": "bilinear", 0: "nearest", 2: "bilinear"}


def _pair(value, name: str, symmetric: bool, size: tuple[int, ...] = (2,)) -> tuple[float, ...]:
    if isinstance(value, numbers.Number) and not isinstance(value, bool) and symmetric:
        if value < 0:
            raise ValueError(f"{name}: a single number must be >= 0, got {value}")
        return (-float(value), float(value))
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) in size:
        return tuple(float(v) for v in value)
    sizes = " or ".join(str(s) for s in size)
    raise ValueError(
        f"{name} must be {'a number or ' if symmetric else ''}a list of {sizes} numbers, got {value!r}"
    )


class RandomAffine:
    """torchvision v2's RandomAffine: an angle drawn in ``degrees``, then (with ``translate`` = the maximal
    fractions (x, y) of the width and height) a whole-pixel translation per axis, a ``scale`` and a
    ``shear`` (x range, and y range when four numbers are given), in that order. ``interpolation``: nearest
    (torchvision's default) or bilinear; pixels from outside the image get ``fill`` (0)."""

    def __init__(
        self,
        degrees,
        translate=None,
        scale=None,
        shear=None,
        interpolation="nearest",
        fill=0,
        center=None,
    ) -> None:
        self.degrees = _pair(degrees, "degrees", True)
        self.translate = None
        if translate is not None:
            self.translate = _pair(translate, "translate", False)
            if not all(0.0 <= t <= 1.0 for t in self.translate):
                raise ValueError(f"translate values must be in [0, 1], got {list(translate)}")
        self.scale = None
        if scale is not None:
            self.scale = _pair(scale, "scale", False)
            if not all(s > 0 for s in self.scale):
                raise ValueError(f"scale values must be > 0, got {list(scale)}")
        self.shear = None if shear is None else _pair(shear, "shear", True, (2, 4))
        key = interpolation.lower() if isinstance(interpolation, str) else interpolation
        if key not in _INTERPOLATIONS:
            raise ValueError(f"interpolation must be nearest or bilinear here, got {interpolation!r}")
        self.interpolation = _INTERPOLATIONS[key]
        if fill is not None and not isinstance(fill, numbers.Number | Sequence):
            raise ValueError(f"fill must be a number or a list of numbers, got {fill!r}")
        self.fill = fill
        self.center = None if center is None else _pair(center, "center", False)

    def make_params(self, generator: torch.Generator, height: int, width: int) -> dict[str, Any]:
        angle = _uniform(self.degrees[0], self.degrees[1], generator)
        translate = (0, 0)
        if self.translate is not None:
            max_dx, max_dy = float(self.translate[0] * width), float(self.translate[1] * height)
            tx = round(_uniform(-max_dx, max_dx, generator))
            ty = round(_uniform(-max_dy, max_dy, generator))
            translate = (tx, ty)
        scale = 1.0 if self.scale is None else _uniform(self.scale[0], self.scale[1], generator)
        shear = [0.0, 0.0]
        if self.shear is not None:
            shear[0] = _uniform(self.shear[0], self.shear[1], generator)
            if len(self.shear) == 4:
                shear[1] = _uniform(self.shear[2], self.shear[3], generator)
        return {"angle": angle, "translate": translate, "scale": scale, "shear": tuple(shear)}

    def apply(self, image: torch.Tensor, params: dict[str, Any]) -> torch.Tensor:
        from lerobot_cli.datasets import image_ops

        return image_ops.affine(
            image, **params, interpolation=self.interpolation, fill=self.fill, center=self.center
        )

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        height, width = image.shape[-2:]
        return self.apply(image, self.make_params(generator, height, width))


TRANSFORMS: dict[str, Callable[..., Any]] = {
    "ColorJitter": ColorJitter,
    "Identity": Identity,
    "RandomAffine": RandomAffine,
    "SharpnessJitter": SharpnessJitter,
}


def make_transform(cfg: ImageTransformConfig, name: str = "?"):
    """The transform of one ``tfs`` entry; a ValueError naming the entry for an unknown type or bad kwargs."""
    cls = TRANSFORMS.get(cfg.type)
    if cls is None:
        raise ValueError(
            f"{_TFS}: {name!r} has type {cfg.type!r}, which is not available here (choose from "
            f"{', '.join(sorted(TRANSFORMS))})"
        )
    try:
        return cls(**cfg.kwargs)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{_TFS}: {name!r} ({cfg.type}) kwargs {dict(cfg.kwargs)}: {err}") from None


class RandomSubsetApply:
    """Applies ``n_subset`` of ``transforms``, picked by ``torch.multinomial`` over the normalised
    ``weights`` without replacement; in list order unless ``random_order`` (then in the drawn order)."""

    def __init__(self, transforms: Sequence, weights: Sequence[float], n_subset: int, random_order: bool):
        if len(weights) != len(transforms):
            raise ValueError(f"{len(weights)} weights for {len(transforms)} transforms")
        if not 1 <= n_subset <= len(transforms):
            raise ValueError(f"n_subset must be in [1, {len(transforms)}], got {n_subset}")
        total = sum(weights)
        self.transforms = list(transforms)
        self.p = [w / total for w in weights]
        self.n_subset = n_subset
        self.random_order = random_order

    def choose(self, generator: torch.Generator) -> list[int]:
        import torch

        picked = torch.multinomial(torch.tensor(self.p), self.n_subset, generator=generator)
        if not self.random_order:
            picked = picked.sort().values
        return picked.tolist()

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        for i in self.choose(generator):
            image = self.transforms[i](image, generator)
        return image


class ImageTransforms:
    """LeRobot's ImageTransforms: ``tf(image, generator)`` augments one camera's ``[..., C, H, W]`` float
    frames (stacked history frames share one draw); Identity when off or when nothing has weight."""

    def __init__(self, cfg: ImageTransformsConfig) -> None:
        self.cfg = cfg
        self.names: list[str] = []
        transforms, weights = [], []
        for name, tf in cfg.tfs.items():
            if tf.weight <= 0.0:
                continue
            self.names.append(name)
            transforms.append(make_transform(tf, name))
            weights.append(tf.weight)
        n_subset = min(len(transforms), cfg.max_num_transforms)
        self.tf = (
            RandomSubsetApply(transforms, weights, n_subset, cfg.random_order)
            if cfg.enable and n_subset > 0
            else Identity()
        )

    def __call__(self, image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.tf(image, generator)


# ---------------------------------------------------------------------------------------- in the loader
_SAMPLE_TAG = 0x696D67746631  # "imgtf1": the augmentation draws of one sample


def sample_generator(seed: int, *key: int) -> torch.Generator:
    """The generator of one training sample: seeded by the run's ``seed`` and the sample's ``key`` (its
    place in the data order, e.g. (epoch, dataset index)), independent of rank, worker and batch."""
    import torch
    from lerobot_trainloop.mixture import mixed_seed

    return torch.Generator().manual_seed(mixed_seed(_SAMPLE_TAG, seed, *key))


class AugmentItem:
    """Augments every camera of a training item (``cameras``, in order; one generator for the item, each
    camera drawing its own parameters): uint8 frames become float32 in [0, 1] first (``x / 255``, what
    the device would have made of them), since LeRobot augments float frames."""

    def __init__(self, transforms: ImageTransforms, cameras: Sequence[str], seed: int) -> None:
        self.transforms = transforms
        self.cameras = list(cameras)
        self.seed = seed

    def __call__(self, item: dict, key: Sequence[int]) -> dict:
        import torch

        generator = sample_generator(self.seed, *key)
        out = dict(item)
        for cam in self.cameras:
            frames = out.get(cam)
            if not isinstance(frames, torch.Tensor):
                continue
            if frames.dtype == torch.uint8:
                frames = frames.to(torch.float32).div_(255.0)
            out[cam] = self.transforms(frames, generator)
        return out

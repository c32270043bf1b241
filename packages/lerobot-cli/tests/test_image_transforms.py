"""``--dataset.image_transforms``: LeRobot's config and defaults, the validators, each op against values
worked out by hand on tiny images, and the per-sample draws. (Equality with LeRobot's own torchvision
transforms on the same seeds: ``tools/interop/image_transforms_lerobot_interop.py``.)"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from lerobot_cli.configio import converter
from lerobot_cli.datasets import image_ops
from lerobot_cli.datasets.image_transforms import (
    AugmentItem,
    ColorJitter,
    ImageTransformConfig,
    ImageTransforms,
    ImageTransformsConfig,
    RandomAffine,
    RandomSubsetApply,
    SharpnessJitter,
    sample_generator,
)

LEROBOT_DEFAULTS = {  # LeRobot 0.6.1's lerobot/transforms/transforms.py ImageTransformsConfig()
    "enable": False,
    "max_num_transforms": 3,
    "random_order": False,
    "tfs": {
        "brightness": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"brightness": [0.8, 1.2]}},
        "contrast": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"contrast": [0.8, 1.2]}},
        "saturation": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"saturation": [0.5, 1.5]}},
        "hue": {"weight": 1.0, "type": "ColorJitter", "kwargs": {"hue": [-0.05, 0.05]}},
        "sharpness": {"weight": 1.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}},
        "affine": {
            "weight": 1.0,
            "type": "RandomAffine",
            "kwargs": {"degrees": [-5.0, 5.0], "translate": [0.05, 0.05]},
        },
    },
}


def rgb(*pixels) -> torch.Tensor:
    """A 3×1×N image from N (r, g, b) pixels."""
    return torch.tensor(pixels, dtype=torch.float32).T.reshape(3, 1, len(pixels))


# ------------------------------------------------------------------------------------------------ config
def test_defaults_are_lerobots_and_survive_a_json_round_trip():
    cfg = ImageTransformsConfig()
    data = converter.unstructure(cfg)
    assert _json(data) == LEROBOT_DEFAULTS
    assert list(data["tfs"]) == list(LEROBOT_DEFAULTS["tfs"])  # the order is the application order
    assert converter.structure(_json(data), ImageTransformsConfig) == cfg
    assert ImageTransformConfig() == ImageTransformConfig(1.0, "Identity", {})  # an entry's defaults


def _json(value):
    import json

    return json.loads(json.dumps(value))


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"max_num_transforms": -1}, "--dataset.image_transforms.max_num_transforms must be a whole number"),
        ({"max_num_transforms": 1.5}, "--dataset.image_transforms.max_num_transforms must be a whole number"),
        ({"tfs": {"b": ImageTransformConfig(-1.0, "ColorJitter", {"brightness": 0.1})}}, "weight -1.0"),
        ({"tfs": {"b": ImageTransformConfig(math.inf, "Identity")}}, "weight inf"),
        (
            {"tfs": {"x": ImageTransformConfig(1.0, "GaussianBlur")}},
            "'x' has type 'GaussianBlur', which is not",
        ),
        ({"tfs": {"c": ImageTransformConfig(1.0, "ColorJitter", {"hue": 0.7})}}, "hue must satisfy"),
        (
            {"tfs": {"c": ImageTransformConfig(1.0, "ColorJitter", {"brightness": -1})}},
            "brightness: a single",
        ),
        ({"tfs": {"c": ImageTransformConfig(1.0, "ColorJitter", {"colour": 1})}}, "unexpected keyword"),
        (
            {"tfs": {"s": ImageTransformConfig(1.0, "SharpnessJitter", {"sharpness": [2, 1]})}},
            "0 <= min <= max",
        ),
        ({"tfs": {"a": ImageTransformConfig(1.0, "RandomAffine", {})}}, "degrees"),
        (
            {"tfs": {"a": ImageTransformConfig(1.0, "RandomAffine", {"degrees": 5, "translate": [2, 0]})}},
            "[0, 1]",
        ),
        (
            {
                "tfs": {
                    "a": ImageTransformConfig(1.0, "RandomAffine", {"degrees": 5, "interpolation": "bicubic"})
                }
            },
            "nearest or bilinear",
        ),
    ],
)
def test_a_bad_value_is_one_sentence_naming_the_flag(kwargs, says):
    with pytest.raises(ValueError, match=r"^--dataset\.image_transforms") as err:
        ImageTransformsConfig(**kwargs)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_zero_weight_entries_are_left_out_and_max_num_is_capped():
    tfs = {
        "a": ImageTransformConfig(2.0, "ColorJitter", {"brightness": 0.5}),
        "off": ImageTransformConfig(0.0, "Identity"),
        "b": ImageTransformConfig(6.0, "SharpnessJitter", {"sharpness": 0.5}),
    }
    tf = ImageTransforms(ImageTransformsConfig(enable=True, max_num_transforms=5, tfs=tfs))
    assert tf.names == ["a", "b"] and tf.tf.n_subset == 2 and tf.tf.p == [0.25, 0.75]
    image = torch.rand(3, 8, 8)
    for cfg in (ImageTransformsConfig(), ImageTransformsConfig(enable=True, max_num_transforms=0)):
        assert ImageTransforms(cfg)(image, torch.Generator()) is image  # off: Identity


def test_the_config_module_does_not_import_torch():
    code = (
        "import sys; from lerobot_cli.datasets.image_transforms import ImageTransformsConfig as C;"
        "C(enable=True, max_num_transforms=2); assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -------------------------------------------------------------------------------------------- the ops
def test_brightness_scales_and_clamps():
    image = rgb((0.2, 0.5, 0.9))
    assert torch.allclose(image_ops.adjust_brightness(image, 1.5), rgb((0.3, 0.75, 1.0)), atol=1e-7)


def test_contrast_blends_with_the_frames_mean_luma():
    image = rgb((1.0, 0.0, 0.0), (0.0, 0.0, 1.0))
    mean = (0.2989 + 0.114) / 2
    f = 0.5
    want = rgb(*[tuple(v * f + mean * (1 - f) for v in px) for px in ((1.0, 0.0, 0.0), (0.0, 0.0, 1.0))])
    assert torch.allclose(image_ops.adjust_contrast(image, f), want, atol=1e-6)
    frames = torch.stack([image, image * 0.5])  # a stack: each frame its own mean
    out = image_ops.adjust_contrast(frames, f)
    assert torch.allclose(out[1], image_ops.adjust_contrast(image * 0.5, f), atol=1e-7)


def test_saturation_blends_with_each_pixels_luma():
    image = rgb((0.8, 0.4, 0.2))
    luma = 0.2989 * 0.8 + 0.587 * 0.4 + 0.114 * 0.2
    assert torch.allclose(image_ops.adjust_saturation(image, 0.0), rgb((luma, luma, luma)), atol=1e-6)
    f = 1.5
    want = rgb(tuple(min(1.0, max(0.0, v * f + luma * (1 - f))) for v in (0.8, 0.4, 0.2)))
    assert torch.allclose(image_ops.adjust_saturation(image, f), want, atol=1e-6)


def test_hue_turns_the_colour_wheel():
    image = rgb((1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.5, 0.5, 0.5), (0.6, 0.3, 0.0))
    hsv = image_ops.rgb_to_hsv(image)
    assert torch.allclose(hsv[0, 0], torch.tensor([0.0, 1 / 3, 0.0, 1 / 12]), atol=1e-6)
    assert torch.allclose(hsv[1, 0], torch.tensor([1.0, 1.0, 0.0, 1.0]))
    # A third of a turn: red → green, green → blue; grey stays grey; orange (hue 30°) → 150°.
    out = image_ops.adjust_hue(image, 1 / 3)
    want = rgb((0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.5, 0.5), (0.0, 0.6, 0.3))
    assert torch.allclose(out, want, atol=1e-6)
    assert torch.allclose(
        image_ops.adjust_hue(image, -1 / 3),
        rgb((0, 0, 1), (1, 0, 0), (0.5, 0.5, 0.5), (0.3, 0, 0.6)),
        atol=1e-6,
    )
    assert torch.allclose(image_ops.hsv_to_rgb(image_ops.rgb_to_hsv(image)), image, atol=1e-6)


def test_sharpness_blends_the_interior_with_its_3x3_smoothing():
    image = torch.zeros(1, 3, 3)
    image[0, 1, 1] = 1.0
    # The centre's smoothing is 5/13; the border is kept.
    out = image_ops.adjust_sharpness(image, 0.0)
    want = image.clone()
    want[0, 1, 1] = 5 / 13
    assert torch.allclose(out, want, atol=1e-7)
    out = image_ops.adjust_sharpness(image, 2.0)  # 1 * 2 + 5/13 * (1 - 2), clamped
    assert out[0, 1, 1] == 1.0 and out.sum() == 1.0
    dark = image * 0.5
    assert torch.allclose(
        image_ops.adjust_sharpness(dark, 1.5)[0, 1, 1], torch.tensor(0.5 * 1.5 - 2.5 / 13 * 0.5)
    )
    small = torch.rand(3, 2, 5)
    assert torch.equal(image_ops.adjust_sharpness(small, 0.0), small)  # too small: unchanged


def test_affine_translates_by_whole_pixels_and_fills_with_zero():
    image = torch.arange(1, 26, dtype=torch.float32).reshape(1, 5, 5) / 25
    out = image_ops.affine(image, 0.0, (1, 2), 1.0, (0.0, 0.0))
    want = torch.zeros_like(image)
    want[0, 2:, 1:] = image[0, :3, :4]
    assert torch.equal(out, want)
    # A quarter turn clockwise about the centre: the top row becomes the right column.
    out = image_ops.affine(image, 90.0, (0, 0), 1.0, (0.0, 0.0))
    assert torch.equal(out[0, :, 4], image[0, 0, :])
    frames = torch.stack([image, image.flip(-1)])  # stacked frames: the same map for each
    stacked = image_ops.affine(frames, 90.0, (0, 0), 1.0, (0.0, 0.0))
    assert torch.equal(stacked[0], out)
    assert torch.equal(stacked[1], image_ops.affine(image.flip(-1), 90.0, (0, 0), 1.0, (0.0, 0.0)))


def test_ops_never_write_to_their_input():
    image = torch.rand(2, 3, 6, 7)
    keep = image.clone()
    for op in (image_ops.adjust_brightness, image_ops.adjust_contrast, image_ops.adjust_saturation):
        op(image, 1.3)
    image_ops.adjust_hue(image, 0.2)
    image_ops.adjust_sharpness(image, 0.3)
    image_ops.affine(image, 10.0, (1, 1), 1.1, (3.0, 0.0), "bilinear")
    assert torch.equal(image, keep)


# ----------------------------------------------------------------------------------------------- draws
def test_color_jitter_draws_its_order_then_each_factor_given():
    g = torch.Generator().manual_seed(3)
    params = ColorJitter(brightness=0.2, hue=0.1).make_params(g)
    ref = torch.Generator().manual_seed(3)
    order = torch.randperm(4, generator=ref).tolist()
    b = torch.empty(1).uniform_(0.8, 1.2, generator=ref).item()
    h = torch.empty(1).uniform_(-0.1, 0.1, generator=ref).item()
    assert params == {"order": order, "factors": [b, None, None, h]}


def test_affine_and_sharpness_draw_in_torchvisions_order():
    g = torch.Generator().manual_seed(5)
    params = RandomAffine(degrees=10, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(1, 2, 3, 4)).make_params(
        g, 20, 40
    )
    ref = torch.Generator().manual_seed(5)
    draw = [torch.empty(1).uniform_(lo, hi, generator=ref).item() for lo, hi in ((-10, 10), (-4, 4), (-4, 4))]
    rest = [torch.empty(1).uniform_(lo, hi, generator=ref).item() for lo, hi in ((0.9, 1.1), (1, 2), (3, 4))]
    assert params == {
        "angle": draw[0],
        "translate": (round(draw[1]), round(draw[2])),
        "scale": rest[0],
        "shear": (rest[1], rest[2]),
    }
    assert SharpnessJitter(0.7).sharpness == (0.30000000000000004, 1.7)


def test_the_subset_is_a_multinomial_draw_without_replacement():
    subset = RandomSubsetApply([None] * 4, [1.0, 2.0, 3.0, 4.0], 3, random_order=False)
    ref = torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4]), 3, generator=torch.Generator().manual_seed(9))
    assert subset.choose(torch.Generator().manual_seed(9)) == sorted(ref.tolist())
    subset.random_order = True
    assert subset.choose(torch.Generator().manual_seed(9)) == ref.tolist()


def test_a_samples_draws_depend_on_seed_and_key_only():
    tf = ImageTransforms(ImageTransformsConfig(enable=True, max_num_transforms=6))
    augment = AugmentItem(tf, ["cam.a", "cam.b"], seed=1)
    frames = (torch.rand(3, 3, 16, 16) * 255).to(torch.uint8)
    item = {"cam.a": frames, "cam.b": frames[0].clone(), "state": torch.ones(2)}
    one = augment(item, (0, 17))
    assert one["cam.a"].dtype == torch.float32 and one["state"] is item["state"]
    assert torch.equal(one["cam.a"], augment(item, (0, 17))["cam.a"])  # same key: same draws
    for other in (
        augment(item, (1, 17)),
        augment(item, (0, 18)),
        AugmentItem(tf, ["cam.a", "cam.b"], 2)(item, (0, 17)),
    ):
        assert not torch.equal(one["cam.a"], other["cam.a"])  # another epoch, sample or seed
    # The cameras draw one after the other from the sample's generator: the second camera's parameters
    # are not the first's.
    g = sample_generator(1, 0, 17)
    first = tf(frames.float() / 255, g)
    assert torch.equal(first, one["cam.a"])
    assert torch.equal(tf(frames[0].float() / 255, g), one["cam.b"])
    assert not torch.equal(one["cam.b"], tf(frames[0].float() / 255, sample_generator(1, 0, 17)))

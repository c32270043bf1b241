r"""``--dataset.image_transforms`` against LeRobot 0.6.1's ``ImageTransforms`` (torchvision v2 underneath).

1. lerobot  (LeRobot env, a subprocess of this script) for each case (a config and a seed) and each image
            (a random 3×H×W frame and a T×3×H×W stack of history frames): ``torch.manual_seed(seed)`` then
            LeRobot's ``ImageTransforms(cfg)(image)``; writes the names of the transforms its
            ``RandomSubsetApply`` picked and the output. Also its ``ImageTransformsConfig()`` defaults.
2. ours     (our env) the same images through our ``ImageTransforms`` with
            ``torch.Generator().manual_seed(seed)``: the picked transforms must be the same, the outputs
            equal within ATOL (bitwise where the op allows), and LeRobot's config defaults equal ours.
3. report   the cases, the max |Δ| per transform type, PASS or FAIL.

    uv run python tools/interop/image_transforms_lerobot_interop.py \
        --lerobot-python ~/.cache/lerobot-interop/lerobot-0.6.1-py312/bin/python

Exit status 0 means every case matched.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Float32 colour ops with the same arithmetic order are bitwise; the affine's grid_sample and the
# sharpness convolution may differ in the last bit across torch builds (LeRobot's env runs another torch).
ATOL = 1e-6
SEEDS = (0, 1, 7, 123, 2024)
SIZES = ((3, 48, 64), (4, 3, 40, 36), (1, 20, 24))  # a frame; stacked history frames; grayscale
ALONE = {
    "brightness": ("ColorJitter", {"brightness": [0.5, 1.5]}),
    "contrast": ("ColorJitter", {"contrast": [0.5, 1.5]}),
    "saturation": ("ColorJitter", {"saturation": [0.0, 2.0]}),
    "hue": ("ColorJitter", {"hue": [-0.5, 0.5]}),
    "jitter_all": ("ColorJitter", {"brightness": 0.3, "contrast": 0.3, "saturation": 0.3, "hue": 0.2}),
    "sharpness": ("SharpnessJitter", {"sharpness": [0.0, 3.0]}),
    "sharpness_number": ("SharpnessJitter", {"sharpness": 0.7}),
    "affine": ("RandomAffine", {"degrees": [-30.0, 30.0], "translate": [0.2, 0.1]}),
    "affine_full": (
        "RandomAffine",
        {"degrees": 20, "translate": [0.1, 0.1], "scale": [0.8, 1.2], "shear": [-10, 10, -5, 5]},
    ),
    "affine_bilinear": ("RandomAffine", {"degrees": 15, "interpolation": 2, "fill": 0.5}),
    "affine_center": ("RandomAffine", {"degrees": [10, 40], "scale": [0.5, 0.9], "center": [10, 5]}),
    "identity": ("Identity", {}),
}


def cases() -> list[dict]:
    """[{name, seed, cfg}] with ``cfg`` LeRobot's ImageTransformsConfig as JSON (``tfs`` None: defaults)."""
    out = []
    base = {"enable": True, "max_num_transforms": 3, "random_order": False, "tfs": None}
    for seed in SEEDS:
        out.append({"name": "defaults", "seed": seed, "cfg": base})
        out.append({"name": "random_order", "seed": seed, "cfg": {**base, "random_order": True}})
        for n in range(1, 7):
            out.append({"name": f"max_{n}", "seed": seed, "cfg": {**base, "max_num_transforms": n}})
        out.append(
            {
                "name": "max_6_random_order",
                "seed": seed,
                "cfg": {**base, "max_num_transforms": 6, "random_order": True},
            }
        )
        for name, (kind, kwargs) in ALONE.items():
            tfs = {name: {"weight": 1.0, "type": kind, "kwargs": kwargs}}
            out.append({"name": f"alone_{name}", "seed": seed, "cfg": {**base, "tfs": tfs}})
        weighted = {
            "brightness": {"weight": 3.0, "type": "ColorJitter", "kwargs": {"brightness": [0.8, 1.2]}},
            "hue": {"weight": 0.5, "type": "ColorJitter", "kwargs": {"hue": [-0.1, 0.1]}},
            "off": {"weight": 0.0, "type": "ColorJitter", "kwargs": {"contrast": [0.1, 3.0]}},
            "sharp": {"weight": 2.0, "type": "SharpnessJitter", "kwargs": {"sharpness": [0.5, 1.5]}},
            "affine": {
                "weight": 1.0,
                "type": "RandomAffine",
                "kwargs": {"degrees": 10, "translate": [0.1, 0.1]},
            },
        }
        out.append(
            {"name": "weighted", "seed": seed, "cfg": {**base, "max_num_transforms": 2, "tfs": weighted}}
        )
        out.append({"name": "disabled", "seed": seed, "cfg": {**base, "enable": False}})
    return out


def images(seed: int):
    import torch

    g = torch.Generator().manual_seed(10_000 + seed)
    return [torch.rand(size, generator=g) for size in SIZES]


# --------------------------------------------------------------------------------------- LeRobot's side
def lerobot_side(out: Path) -> None:
    import dataclasses

    import torch
    from lerobot.transforms import ImageTransformConfig, ImageTransforms, ImageTransformsConfig
    from safetensors.torch import save_file

    defaults = dataclasses.asdict(ImageTransformsConfig())
    results, tensors = [], {}
    for i, case in enumerate(cases()):
        raw = dict(case["cfg"])
        tfs = raw.pop("tfs")
        kw = {} if tfs is None else {"tfs": {k: ImageTransformConfig(**v) for k, v in tfs.items()}}
        tf = ImageTransforms(ImageTransformsConfig(**raw, **kw))
        names = {id(t): n for n, t in tf.transforms.items()}
        picks = []
        for j, image in enumerate(images(case["seed"])):
            torch.manual_seed(case["seed"])
            tensors[f"{i}/{j}"] = tf(image.clone()).contiguous()
            chosen = getattr(tf.tf, "selected_transforms", [])
            picks.append([names[id(t)] for t in chosen])
        results.append({"picks": picks})
    save_file(tensors, str(out / "lerobot.safetensors"))
    (out / "lerobot.json").write_text(json.dumps({"defaults": defaults, "results": results}))


# ------------------------------------------------------------------------------------------- our side
def ours(out: Path) -> bool:
    import torch
    from lerobot_cli.configio import converter
    from lerobot_cli.datasets.image_transforms import ImageTransforms, ImageTransformsConfig
    from safetensors.torch import load_file

    theirs = json.loads((out / "lerobot.json").read_text())
    ref = load_file(str(out / "lerobot.safetensors"))
    ok = True
    mine_defaults = json.loads(json.dumps(converter.unstructure(ImageTransformsConfig())))
    if mine_defaults != theirs["defaults"]:
        print(f"FAIL defaults: LeRobot {theirs['defaults']}\n              ours    {mine_defaults}")
        ok = False
    else:
        print(f"defaults equal: {json.dumps(mine_defaults)}")
    worst: dict[str, float] = {}
    bitwise: dict[str, bool] = {}
    for i, (case, result) in enumerate(zip(cases(), theirs["results"], strict=True)):
        raw = {k: v for k, v in case["cfg"].items() if not (k == "tfs" and v is None)}
        tf = ImageTransforms(converter.structure(raw, ImageTransformsConfig))
        for j, image in enumerate(images(case["seed"])):
            g = torch.Generator().manual_seed(case["seed"])
            picks = (
                [tf.names[k] for k in tf.tf.choose(torch.Generator().manual_seed(case["seed"]))]
                if hasattr(tf.tf, "choose")
                else []
            )
            got = tf(image.clone(), g)
            want = ref[f"{i}/{j}"]
            diff = float((got - want).abs().max()) if got.shape == want.shape else float("inf")
            key = case["name"]
            worst[key] = max(worst.get(key, 0.0), diff)
            bitwise[key] = bitwise.get(key, True) and bool(torch.equal(got, want))
            if picks != result["picks"][j] or not diff <= ATOL:
                ok = False
                print(
                    f"FAIL {key} seed={case['seed']} image={tuple(image.shape)}: picks LeRobot "
                    f"{result['picks'][j]} ours {picks}, max|Δ|={diff:.3g}"
                )
    print(f"{len(cases())} cases x {len(SIZES)} images (shapes {SIZES}), ATOL={ATOL}")
    for key, diff in worst.items():
        print(f"  {key:24s} max|Δ|={diff:.3g} {'bitwise' if bitwise[key] else ''}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lerobot-python", type=Path, help="LeRobot 0.6.1's interpreter")
    parser.add_argument("--lerobot-side", type=Path, help=argparse.SUPPRESS)  # run in LeRobot's env
    args = parser.parse_args()
    if args.lerobot_side is not None:
        lerobot_side(args.lerobot_side)
        return 0
    if args.lerobot_python is None:
        parser.error("--lerobot-python is required")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [str(args.lerobot_python), __file__, "--lerobot-side", tmp],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if proc.returncode != 0:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
            print("FAIL (LeRobot's side did not run)")
            return 1
        ok = ours(Path(tmp))
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""``--policy.pretrained_backbone_weights``: a torchvision name resolves to torchvision's cache file and is
downloaded into it when missing (over real HTTP from a local server standing in for
download.pytorch.org, via ``$LEROBOT_BACKBONE_WEIGHTS_URL``), checked against the file name's SHA-256
prefix; a cached file is never fetched again; offline, one sentence says how to go on. ACT and
Diffusion Policy default to LeRobot's ``ResNet18_Weights.IMAGENET1K_V1``."""

from __future__ import annotations

import hashlib
import http.server
import io
import socket
import threading

import pytest
import torch
from lerobot_cli.policies import backbone_weights as bw
from lerobot_cli.policies.act.backbone import ResNetFeatureMap, load_backbone_weights
from lerobot_cli.policies.act.config import ACTConfig
from lerobot_cli.policies.diffusion.config import DiffusionConfig


def _weights_bytes() -> bytes:
    torch.manual_seed(3)
    state = {k: torch.randn_like(v) for k, v in ResNetFeatureMap("resnet18").state_dict().items()}
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


class Mirror:
    """A local HTTP server with one file; counts the requests it answered."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.requests = files, []
        mirror = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                mirror.requests.append(self.path)
                body = mirror.files.get(self.path.rsplit("/", 1)[-1])
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/models/"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def weights(tmp_path, monkeypatch):
    """The torch hub dir in tmp, and ResNet18's file name carrying the test file's own hash prefix."""
    data = _weights_bytes()
    name = f"resnet18-{hashlib.sha256(data).hexdigest()[:8]}.pth"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    monkeypatch.setitem(bw.TORCHVISION_FILES, "ResNet18_Weights.IMAGENET1K_V1", name)
    mirror = Mirror({name: data})
    monkeypatch.setenv(bw.URL_ENV, mirror.url)
    yield mirror, tmp_path / "hub" / "checkpoints" / name, data
    mirror.close()


def test_lerobot_defaults():
    assert ACTConfig().pretrained_backbone_weights == "ResNet18_Weights.IMAGENET1K_V1"
    assert DiffusionConfig().pretrained_backbone_weights == "ResNet18_Weights.IMAGENET1K_V1"


def test_missing_file_is_downloaded_into_torchvisions_cache_once(weights):
    mirror, cached, data = weights
    assert bw.resolve_backbone_weights("ResNet18_Weights.DEFAULT") == cached
    assert cached.read_bytes() == data and len(mirror.requests) == 1
    assert bw.resolve_backbone_weights("ResNet18_Weights.IMAGENET1K_V1") == cached
    assert len(mirror.requests) == 1  # cached: not fetched again
    net = ResNetFeatureMap("resnet18")
    load_backbone_weights(net, "ResNet18_Weights.IMAGENET1K_V1")
    assert torch.equal(net.state_dict()["layer1.0.conv1.weight"], torch.load(cached)["layer1.0.conv1.weight"])


def test_a_file_that_does_not_match_the_hash_is_refused_and_not_kept(weights, monkeypatch):
    mirror, cached, data = weights
    mirror.files[cached.name] = data + b"tampered"
    with pytest.raises(bw.BackboneWeightsUnavailable, match="not torchvision's .*: refused"):
        bw.resolve_backbone_weights("ResNet18_Weights.IMAGENET1K_V1")
    assert not cached.exists() and not list(cached.parent.glob(".*part*"))


def test_offline_says_how_to_go_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with socket.socket() as s:  # a port nothing listens on: refused at once, no DNS, no network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(bw.URL_ENV, f"http://127.0.0.1:{port}/")
    with pytest.raises(bw.BackboneWeightsUnavailable) as err:
        bw.resolve_backbone_weights("ResNet18_Weights.IMAGENET1K_V1")
    message = str(err.value)
    assert "not in the torch hub cache" in message and "the download from http://127.0.0.1" in message
    assert (
        "pass --policy.pretrained_backbone_weights=null for a randomly initialised backbone, "
        "or the path of a local torchvision ResNet file" in message
    )
    with pytest.raises(bw.BackboneWeightsUnavailable, match="does not download it"):
        bw.resolve_backbone_weights("ResNet18_Weights.IMAGENET1K_V1", download=False)


def test_other_specs(tmp_path):
    local = tmp_path / "r18.pth"
    local.write_bytes(_weights_bytes())
    assert bw.resolve_backbone_weights(str(local)) == local
    with pytest.raises(bw.BackboneWeightsUnavailable, match="no file at"):
        bw.resolve_backbone_weights(str(tmp_path / "missing.pth"))
    with pytest.raises(bw.ConfigError, match="unknown torchvision weights"):
        bw.resolve_backbone_weights("ResNet18_Weights.IMAGENET9K")

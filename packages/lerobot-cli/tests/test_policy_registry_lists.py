"""Every list of policies in the tests and tools is the registry's: a new policy is one folder and one
registration.

The interop drivers, ``tools/interop/ci.sh`` (LeRobot's extras), the pinned LeRobot fields, the extension
and extras tests once each kept their own list of policy names, which a new policy silently escaped. They
now read the registry (``registry.available``, each spec's ``in_lerobot``, ``extras``, ``lerobot_extras``);
tools outside our environment get it from ``python -m lerobot_cli.policies.manifest``. What cannot be derived
(a pinned field list, a driver's flags) stays a table that fails naming a registered policy it lacks. The
last test adds a throwaway policy (a folder on ``sys.path`` and one line in the built-in table) and sees it
in every derived list and missing from every such table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import ClassVar

import pytest
from attrs import define
from lerobot_cli.cli.argv import split_argv
from lerobot_cli.cli.build import build_train_config
from lerobot_cli.cli.help import render_help
from lerobot_cli.policies import PolicyConfig, PolicySpec, manifest, registry

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
INTEROP = REPO / "tools" / "interop"


def _load(path: Path) -> ModuleType:
    """A test helper, another test file or an interop driver, by path (their imports at the top are
    stdlib and lerobot_cli only; the drivers import LeRobot inside their LeRobot-side functions)."""
    spec = importlib.util.spec_from_file_location(f"lerobot_cli_tests_lists_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


policy_tables = _load(HERE / "policy_tables.py")
config_pins = _load(HERE / "test_policy_config_extensions.py")
extras_tests = _load(HERE / "test_extras.py")
config_driver = _load(INTEROP / "config_lerobot_interop.py")
defaults_driver = _load(INTEROP / "defaults_lerobot_interop.py")
weighting_driver = _load(INTEROP / "sample_weighting_lerobot_interop.py")


def test_lerobot_metadata_needs_in_lerobot():
    """Fields LeRobot's class lacks, or LeRobot extras, make no sense for a policy LeRobot does not have."""
    for field in ("lerobot_extras", "extension_fields"):
        with pytest.raises(ValueError, match=rf"PolicySpec.{field} is set but in_lerobot is False"):
            PolicySpec(model="m:P", **{field: ("x",)})
    assert PolicySpec(model="m:P", in_lerobot=True, lerobot_extras=["pi"]).lerobot_extras == ("pi",)


def test_the_manifest_is_the_registry(capsys):
    names = registry.available()
    specs = {name: registry.config_class(name).spec for name in names}
    meta = manifest.policies()
    assert list(meta) == names
    assert manifest.in_lerobot() == [name for name in names if specs[name].in_lerobot]
    assert manifest.lerobot_extras() == sorted({e for spec in specs.values() for e in spec.lerobot_extras})
    # what the lists were by hand before: LeRobot has every built-in but mlp; ci.sh installed these extras
    assert set(manifest.in_lerobot()) >= {"act", "diffusion", "fastwam", "pi0", "pi05", "smolvla"}
    assert "mlp" not in manifest.in_lerobot()
    assert set(manifest.lerobot_extras()) >= {"pi", "diffusion", "fastwam", "smolvla"}
    manifest.main(["lerobot-extras"])
    assert capsys.readouterr().out == ",".join(manifest.lerobot_extras()) + "\n"
    manifest.main([])
    assert json.loads(capsys.readouterr().out) == meta


def test_the_manifest_runs_without_torch():
    """ci.sh calls it before anything else: it must not pay torch's import (nor need a GPU build of it)."""
    code = (
        "import sys; from lerobot_cli.policies import manifest; manifest.main(['names']); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ",".join(registry.available())


# ---------------------------------------------------------------- tools/interop/ci.sh


def _ci_snippet() -> str:
    """ci.sh's lines that compute LEROBOT_EXTRAS and its ``env_ok``, as they are in the file."""
    lines = (INTEROP / "ci.sh").read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("policy_extras="))
    end = next(i for i, line in enumerate(lines) if line.startswith("LEROBOT_EXTRAS="))
    ok = next(i for i, line in enumerate(lines) if line.startswith("env_ok() {"))
    ok_end = next(i for i in range(ok, len(lines)) if lines[i] == "}\n")
    return "".join(lines[start : end + 1] + lines[ok : ok_end + 1])


def _fake_lerobot_env(root: Path, extras: list[str], installed: dict[str, str]) -> Path:
    """A "LeRobot environment": an interpreter that sees only distributions written here (and packaging):
    lerobot 0.6.1 whose every extra in ``extras`` requires ``dep-<extra>``, as its [pi] requires
    transformers through lerobot[transformers-dep]."""
    site = root / "site"
    site.mkdir(parents=True)
    import packaging

    (site / "packaging").symlink_to(Path(packaging.__file__).parent)
    meta = ["Metadata-Version: 2.1", "Name: lerobot", "Version: 0.6.1", "Provides-Extra: transformers-dep"]
    meta += [f"Provides-Extra: {extra}" for extra in extras]
    meta += [f'Requires-Dist: dep-{extra}; extra == "{extra}"' for extra in extras]
    meta += [
        'Requires-Dist: lerobot[transformers-dep]; extra == "pi"',
        'Requires-Dist: transformers<5.6,>=5.4; extra == "transformers-dep"',
    ]
    for name, version in {"lerobot": "0.6.1", "peft": "0.21.2", **installed}.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        text = (
            "\n".join(meta)
            if name == "lerobot"
            else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"
        )
        (info / "METADATA").write_text(text + "\n")
    python = root / "bin" / "python"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    return root


def _ci(venv: Path) -> tuple[str, int, str]:
    """ci.sh's snippet run with ``uv run --frozen python`` as this interpreter: (LEROBOT_EXTRAS, env_ok's
    status, its stderr)."""
    script = (
        "set -euo pipefail\n"
        'uv() { [ "$1 $2 $3" = "run --frozen python" ] || exit 9; shift 3; "$OUR_PYTHON" "$@"; }\n'
        + _ci_snippet()
        + 'echo "$LEROBOT_EXTRAS"\nstatus=0\nenv_ok || status=$?\necho "$status"\n'
    )
    env = {
        **os.environ,
        "OUR_PYTHON": sys.executable,
        "VENV": str(venv),
        "LEROBOT_VERSION": "0.6.1",
        "PEFT_VERSION": "0.21.2",
    }
    res = subprocess.run(
        ["bash", "-c", script], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    extras, status = res.stdout.split()
    return extras, int(status), res.stderr


# LeRobot extras ci.sh adds for the tools rather than the policies: its datasets, its PushT evaluation
TOOL_EXTRAS = ["dataset", "pusht"]


def test_ci_sh_installs_the_lerobot_extras_the_registry_names(tmp_path):
    """ci.sh builds LeRobot's env with the registry's LeRobot extras (no list of its own), and reuses an env
    only when every requirement of each is installed: a new policy's extra is not silently missing."""
    extras = manifest.lerobot_extras()
    text = (INTEROP / "ci.sh").read_text()
    assert "lerobot[pi" not in text and "lerobot[${LEROBOT_EXTRAS}]==" in text
    deps = {f"dep-{extra}": "1.0" for extra in [*extras, *TOOL_EXTRAS]}
    full = _fake_lerobot_env(tmp_path / "full", [*extras, *TOOL_EXTRAS], {**deps, "transformers": "5.5.4"})
    assert _ci(full)[:2] == (",".join([*extras, *TOOL_EXTRAS]), 0)

    lacking = extras[-1]
    partial = {name: v for name, v in deps.items() if name != f"dep-{lacking}"}
    env = _fake_lerobot_env(
        tmp_path / "partial", [*extras, *TOOL_EXTRAS], {**partial, "transformers": "5.5.4"}
    )
    _, status, err = _ci(env)
    assert status == 3 and f"lacks dep-{lacking} (lerobot[{lacking}])" in err

    env = _fake_lerobot_env(tmp_path / "unknown", ["dataset"], {**deps, "transformers": "5.5.4"})
    _, status, err = _ci(env)
    assert status == 4 and "has no extras" in err

    env = _fake_lerobot_env(
        tmp_path / "nested", [*extras, *TOOL_EXTRAS], deps
    )  # [pi]'s lerobot[transformers-dep]
    _, status, err = _ci(env)
    assert status == 3 and "lacks transformers (lerobot[transformers-dep])" in err

    env = _fake_lerobot_env(tmp_path / "new", [*extras, *TOOL_EXTRAS], {**deps, "transformers": "5.6.0"})
    assert _ci(env)[1] == 1  # a transformers pi0 cannot use: rebuilt


# ---------------------------------------------------------------- the interop drivers


def test_the_config_driver_checks_every_registered_policy():
    assert config_driver.registered() == {
        name: registry.config_class(name).spec.in_lerobot for name in registry.available()
    }
    assert config_driver.unknown_to_lerobot("mlp") == "Policy type 'mlp'"  # LeRobot's refusal, as pinned


def test_the_defaults_driver_covers_every_policy_lerobot_has():
    in_lerobot = manifest.in_lerobot()
    assert defaults_driver.registered_in_lerobot() == in_lerobot
    assert defaults_driver.coverage_problems(in_lerobot) == []
    assert set(defaults_driver.SAME) | set(defaults_driver.NOT_CHECKED) == set(in_lerobot)


def test_the_sample_weighting_driver_covers_every_policy_with_a_per_sample_loss():
    assert weighting_driver.coverage_problems() == []
    assert set(weighting_driver.FLAVOURED) == {
        name for name in registry.available() if registry.config_class(name).spec.per_sample_loss
    }


def missing_interop_drivers(names: list[str]) -> list[str]:
    """One line per policy of ``names`` without a driver of its own,
    ``tools/interop/<name>_lerobot_interop.py`` (ci.sh runs every such file)."""
    return [
        f"policy {name!r} registered (in LeRobot) but has no tools/interop/{name}_lerobot_interop.py: add one"
        for name in names
        if not (INTEROP / f"{name}_lerobot_interop.py").is_file()
    ]


def test_every_policy_lerobot_has_has_its_interop_driver():
    """A policy LeRobot also has is compared with LeRobot's own by a driver named after it (ci.sh's glob
    runs it); mlp, which LeRobot lacks, needs none."""
    assert missing_interop_drivers(manifest.in_lerobot()) == []
    assert "mlp" not in manifest.in_lerobot()


# ---------------------------------------------------------------- a new policy

_CONFIG = """
from typing import ClassVar

from attrs import define, field
from lerobot_cli.policies import PolicyConfig, PolicySpec


@define(frozen=True, kw_only=True)
class ThrowawayConfig(PolicyConfig):
    type: ClassVar[str] = "throwaway"
    spec: ClassVar[PolicySpec] = PolicySpec(
        model="throwaway_policy.modeling:ThrowawayPolicy",
        in_lerobot=True,
        lerobot_extras=("throwaway-extra",),
        extras=("pi",),
        per_sample_loss=True,
    )

    width: int = field(default=3, metadata={"help": "Throwaway width."})
"""


@pytest.fixture
def throwaway(tmp_path, monkeypatch) -> str:
    """One folder (``throwaway_policy/``, its config here) and one registration (a built-in table line)."""
    folder = tmp_path / "throwaway_policy"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "config.py").write_text(_CONFIG)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry._BUILTIN, "throwaway", "throwaway_policy.config:ThrowawayConfig")
    yield "throwaway"
    for name in [m for m in sys.modules if m.startswith("throwaway_policy")]:
        del sys.modules[name]


def test_a_new_policy_is_one_folder_and_one_registration(throwaway):
    """Registered, the new policy is in every list derived from the registry (the CLI's choices and help,
    the manifest ci.sh and the drivers read, the extras tests' cases), and every table that cannot be
    derived fails naming it until it has its entry."""
    # the CLI
    assert throwaway in registry.available()
    policy_line = next(line for line in render_help(None).splitlines() if "--policy.type {" in line)
    assert f",{throwaway}," in policy_line or f",{throwaway}}}" in policy_line
    config = build_train_config(split_argv([f"--policy.type={throwaway}", "--policy.width=5"]).flags).config
    assert type(config.policy).type == throwaway and config.policy.width == 5
    with pytest.raises(registry.UnknownPolicyError, match=rf"choose from .*{throwaway}"):
        registry.config_class("nope")
    # the manifest (ci.sh's LeRobot extras, the drivers' policies)
    assert manifest.policies()[throwaway]["in_lerobot"] and throwaway in manifest.in_lerobot()
    assert "throwaway-extra" in manifest.lerobot_extras()
    assert config_driver.registered()[throwaway] is True
    # the extras tests: its extra's modules are each a case
    assert (throwaway, "pi", "transformers") in extras_tests.policy_extra_cases()
    # the tables that cannot be derived name it until it has an entry
    for what, table in config_pins.TABLES.items():
        assert policy_tables.unlisted(table, what) == [
            f"policy {throwaway!r} registered but has no {what}: add it"
        ]
        with pytest.raises(AssertionError, match=f"policy '{throwaway}' registered but has no"):
            policy_tables.require_every_policy(table, what)
    assert defaults_driver.coverage_problems(manifest.in_lerobot()) == [
        (
            f"policy {throwaway!r} registered (in LeRobot) but has no flags in SAME nor a reason in "
            "NOT_CHECKED: add one"
        )
    ]
    assert weighting_driver.coverage_problems() == [
        f"policy {throwaway!r} registered with a per-sample loss but has no flavour in FLAVOURED: add one"
    ]
    driver = f"tools/interop/{throwaway}_lerobot_interop.py"
    assert missing_interop_drivers(manifest.in_lerobot()) == [
        f"policy {throwaway!r} registered (in LeRobot) but has no {driver}: add one"
    ]


def test_a_plugin_policy_is_in_the_manifest_the_tools_read(tmp_path):
    """The tools outside our env read the manifest in a process of their own: a policy from another package
    (its folder plus one entry point, as ``tests/test_policy_plugin.py`` installs it) is in it there."""
    folder = tmp_path / "throwaway_policy"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "config.py").write_text(_CONFIG)
    info = tmp_path / "throwaway_policy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: throwaway-policy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\nthrowaway = throwaway_policy.config:ThrowawayConfig\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    run = [sys.executable, "-m", "lerobot_cli.policies.manifest"]
    res = subprocess.run(run, env=env, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(res.stdout)["throwaway"]["lerobot_extras"] == ["throwaway-extra"]
    res = subprocess.run(
        [*run, "lerobot-extras"], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert "throwaway-extra" in res.stdout.strip().split(",")


def test_a_registered_class_is_in_the_lists_too():
    """``registry.register`` (in-process) reaches the same lists as the built-in table's line."""

    @define(frozen=True, kw_only=True)
    class InProcess(PolicyConfig):
        type: ClassVar[str] = "in_process_test"
        spec: ClassVar[PolicySpec] = PolicySpec(model="m:P")

    try:
        registry.register(InProcess)
        assert "in_process_test" in registry.available() and "in_process_test" in manifest.policies()
        assert "in_process_test" not in manifest.in_lerobot()  # not in LeRobot: no interop driver expects it
    finally:
        registry._REGISTERED.pop("in_process_test", None)

"""Package boundaries from ARCHITECTURE.md, checked on the source (every import statement)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"lerobot_parallel", "lerobot_ckpt", "lerobot_trainloop", "lerobot_cli"}
ALLOWED = {
    "lerobot_parallel": set(),
    "lerobot_ckpt": set(),
    "lerobot_trainloop": {"lerobot_parallel"},
    "lerobot_cli": {"lerobot_parallel", "lerobot_ckpt", "lerobot_trainloop"},
}
FORBIDDEN_THIRD_PARTY = {"lerobot_ckpt": {"accelerate"}, "lerobot_trainloop": {"accelerate"}}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package):
    src = ROOT / "packages" / package.replace("_", "-") / "src" / package
    files = sorted(src.rglob("*.py"))
    assert files, f"no sources found for {package}"
    for path in files:
        roots = imported_roots(path)
        siblings = (roots & OURS) - {package}
        assert siblings <= ALLOWED[package], f"{path.relative_to(ROOT)} imports {sorted(siblings - ALLOWED[package])}"
        bad = roots & FORBIDDEN_THIRD_PARTY.get(package, set())
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_checker_catches_a_violation(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("import accelerate\nfrom lerobot_cli.config import TrainConfig\n")
    assert {"accelerate", "lerobot_cli"} <= imported_roots(bad)


def test_dependency_declarations_follow_the_dag():
    import tomllib

    for package, allowed in ALLOWED.items():
        meta = tomllib.loads((ROOT / "packages" / package.replace("_", "-") / "pyproject.toml").read_text())
        deps = {d.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().replace("-", "_")
                for d in meta["project"]["dependencies"]}
        assert (deps & OURS) <= allowed, package
        assert not deps & FORBIDDEN_THIRD_PARTY.get(package, set()), package

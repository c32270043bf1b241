"""Package boundaries, checked on the source (every import statement, lazy ones included).

The allowed edges restate the project's architecture (the shared ARCHITECTURE.md, kept outside this
repository): ``lerobot-cli → {trainloop, ckpt, parallel}``, ``trainloop → parallel``, ``ckpt`` alone.
"""

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


def _module_name(src: Path, path: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (function-level imports included:
    a lazy import is still a dependency, it only moves the cost)."""
    src = ROOT / "packages" / package.replace("_", "-") / "src" / package
    modules = {_module_name(src, p): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(package) and target != package:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_modules_inside_a_package_form_a_dag(package):
    """No two modules import each other, directly or around a loop, not even lazily inside a function:
    a cycle means neither module can be read, tested or moved without the other."""
    assert cycles(module_graph(package)) == []


def test_cycle_finder_finds_a_lazy_cycle():
    assert cycles({"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}) == [["p.a", "p.b"]]

"""Package boundaries, checked on the source: every import statement (lazy ones included) and, inside a
package, every ``importlib.import_module`` call whose target the source names (see ``module_graph``).

The allowed edges restate the project's architecture (the shared ARCHITECTURE.md, kept outside this
repository): ``lerobot-cli → {trainloop, ckpt, parallel}``, ``trainloop → parallel``, ``ckpt`` alone.
Inside lerobot-cli, ``LAYERS`` keeps the policy and optimizer code off the command line and policies and
datasets off each other, and ``NEUTRAL`` names the modules both sides share.
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
        assert siblings <= ALLOWED[package], (
            f"{path.relative_to(ROOT)} imports {sorted(siblings - ALLOWED[package])}"
        )
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
        deps = {
            d.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().replace("-", "_")
            for d in meta["project"]["dependencies"]
        }
        assert (deps & OURS) <= allowed, package
        assert not deps & FORBIDDEN_THIRD_PARTY.get(package, set()), package


def _module_name(src: Path, path: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_import_call(node: ast.AST) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )


def _named_modules(text: str, name: str, is_pkg: bool, modules: dict) -> list[str]:
    """The modules of the package a string names: ``pkg.mod``, ``pkg.mod:attr`` (an entry-point style
    target), or, in a package's ``__init__``, a submodule's short name (``f"{__name__}.{short}"``).
    Never ``name``'s own packages: they are imported before it anyway, and a string equal to one is
    something else (``"lerobot_cli.policies"`` is also the plugins' entry-point group)."""
    dotted = text.partition(":")[0]
    found = [dotted] if dotted in modules else []
    if is_pkg and f"{name}.{text}" in modules:
        found.append(f"{name}.{text}")
    return [m for m in found if not name.startswith(f"{m}.")]


def module_graph(package: str, src: Path | None = None) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports: every ``import`` statement (inside functions
    and ``TYPE_CHECKING`` blocks too: a lazy import is still a dependency, it only moves the cost), an
    edge to the package root included (``from pkg import name`` runs ``pkg/__init__``, which may itself
    re-export the importer), and every ``importlib.import_module``/``__import__`` call: a constant name,
    or, when the name is computed (a lazy re-export's ``__getattr__``, a registry), every string in that
    module that names a module of the package (``_LAZY``'s values, ``"pkg.mod:attr"`` targets)."""
    src = src or ROOT / "packages" / package.replace("_", "-") / "src" / package
    modules = {_module_name(src, p): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        strings = [
            n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        ]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif _is_import_call(node) and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    relative = first.value.startswith(".")
                    anchor = name if is_pkg else name.rpartition(".")[0]
                    targets = [anchor + first.value if relative else first.value]
                else:
                    targets = [m for text in strings for m in _named_modules(text, name, is_pkg, modules)]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith(package):
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


def test_graph_sees_cycles_through_the_package_root_and_import_module(tmp_path):
    """The edges a source scan most easily drops: ``from pkg import name`` (the root, which lazily
    re-exports the importer through a ``_LAZY`` table and ``importlib.import_module``), a constant
    ``import_module`` name, a relative one, and a ``"module:attr"`` registry target."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        'import importlib\n_LAZY = {"Loop": "pkg.loop"}\n\n'
        "def __getattr__(name):\n    return getattr(importlib.import_module(_LAZY[name]), name)\n"
    )
    (pkg / "loop.py").write_text("from pkg import Config\n")
    (pkg / "a.py").write_text('import importlib\n\ndef f():\n    return importlib.import_module("pkg.b")\n')
    (pkg / "b.py").write_text("from pkg.a import f\n")
    (pkg / "sub" / "__init__.py").write_text(
        'from importlib import import_module\n\ndef g():\n    return import_module(".c", __name__)\n'
    )
    (pkg / "sub" / "c.py").write_text("import pkg.sub\n")
    (pkg / "registry.py").write_text(
        'import importlib\nBUILTIN = {"x": "pkg.plugin:X"}\n\n'
        "def load(key):\n    module, _, attr = BUILTIN[key].partition(':')\n"
        "    return getattr(importlib.import_module(module), attr)\n"
    )
    (pkg / "plugin.py").write_text("from pkg.registry import load\n")
    graph = module_graph("pkg", pkg)
    assert graph["pkg.loop"] == {"pkg"} and graph["pkg"] == {"pkg.loop"}
    assert cycles(graph) == [
        ["pkg", "pkg.loop"],
        ["pkg.a", "pkg.b"],
        ["pkg.plugin", "pkg.registry"],
        ["pkg.sub", "pkg.sub.c"],
    ]


# Inside lerobot-cli: (importer, what it must never reach, why), as subpackages of the package. "Reach" is
# any chain of imports (lazy ones included): a policy that imports a top-level module that imports the
# command line imports the command line.
LAYERS: dict[str, list[tuple[str, str, str]]] = {
    "lerobot_cli": [
        ("policies", "cli", "policy code raises lerobot_cli.errors.ConfigError; the CLI prints it"),
        ("optim", "cli", "optimizer code raises lerobot_cli.errors.ConfigError; the CLI prints it"),
        ("peft", "cli", "PEFT code raises its PeftSetupError; the CLI prints it"),
        ("policies", "datasets", "the feature vocabulary both share is lerobot_cli.features"),
        ("datasets", "policies", "the feature vocabulary both share is lerobot_cli.features"),
    ],
}
# Modules both sides import: they may import each other and nothing else of the package.
NEUTRAL = {"lerobot_cli": {"errors", "features"}}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(f"{prefix}.")


def import_chain(graph: dict[str, set[str]], start: str, target: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` to a module under ``target`` (breadth first), or None."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for module in queue:
        if module != start and _under(module, target):
            chain = [module]
            while (step := previous[chain[-1]]) is not None:
                chain.append(step)
            return chain[::-1]
        for imported in sorted(graph[module]):
            if imported not in previous:
                previous[imported] = module
                queue.append(imported)
    return None


def layer_violations(package: str, graph: dict[str, set[str]]) -> list[str]:
    """One line per module of ``package`` that reaches what its layer must not (``LAYERS``): the chain."""
    found = []
    for importer, forbidden, why in LAYERS.get(package, []):
        for module in sorted(m for m in graph if _under(m, f"{package}.{importer}")):
            chain = import_chain(graph, module, f"{package}.{forbidden}")
            if chain:
                found.append(f"{' -> '.join(chain)}: {why}")
    return found


def neutral_violations(package: str, graph: dict[str, set[str]]) -> list[str]:
    neutral = {f"{package}.{name}" for name in NEUTRAL.get(package, set())}
    return [f"{m} imports {sorted(graph[m] - neutral)}" for m in sorted(neutral) if graph[m] - neutral]


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_layers_inside_a_package_keep_their_direction(package):
    """Policies, optimizers and PEFT never reach the command line (they raise a domain error it turns into
    its one line), and policies and datasets never reach each other."""
    assert layer_violations(package, module_graph(package)) == []


@pytest.mark.parametrize("package", sorted(NEUTRAL))
def test_neutral_modules_import_only_each_other(package):
    graph = module_graph(package)
    assert all(f"{package}.{name}" in graph for name in NEUTRAL[package])
    assert neutral_violations(package, graph) == []


def test_layer_checker_catches_lazy_and_indirect_violations(tmp_path, monkeypatch):
    """A lazy import inside a function, a chain through a top-level module, and a chain through a neutral
    module that imports a layer are each found and named; a module that keeps its layer is not."""
    pkg = tmp_path / "pkg"
    for sub in ("cli", "policies", "datasets", "optim", "peft"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("class ConfigError(ValueError):\n    pass\n")
    (pkg / "cli" / "errors.py").write_text("from pkg.errors import ConfigError\n")
    (pkg / "policies" / "fit.py").write_text("def check():\n    from pkg.cli.errors import UsageError\n")
    (pkg / "optim" / "factory.py").write_text("from pkg import glue\n")
    (pkg / "glue.py").write_text("import pkg.cli.errors\n")
    (pkg / "features.py").write_text("import pkg.policies.types\n")
    (pkg / "policies" / "types.py").write_text("")
    (pkg / "datasets" / "meta.py").write_text("from pkg.features import Feature\n")
    (pkg / "peft" / "ok.py").write_text("from pkg.errors import ConfigError\n")
    monkeypatch.setitem(LAYERS, "pkg", [(i, f, "why") for i, f, _ in LAYERS["lerobot_cli"]])
    monkeypatch.setitem(NEUTRAL, "pkg", {"errors", "features"})
    graph = module_graph("pkg", pkg)
    assert layer_violations("pkg", graph) == [
        "pkg.policies.fit -> pkg.cli.errors: why",
        "pkg.optim.factory -> pkg.glue -> pkg.cli.errors: why",
        "pkg.datasets.meta -> pkg.features -> pkg.policies.types: why",
    ]
    assert neutral_violations("pkg", graph) == ["pkg.features imports ['pkg.policies.types']"]


# -- policy folders: what policies share lives in policies/common, never in another policy's folder ------
SHARED_POLICY_FOLDERS = frozenset({"common"})


def cross_policy_imports(graph: dict[str, set[str]], root: str = "lerobot_cli") -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where a module in one policy folder (``<root>.policies.<X>…``)
    imports a module of another policy folder ``<Y>``. ``common`` and the top-level ``policies`` modules
    (config, features, registry, …) are what policies may share; a policy importing another instead
    ties the two together (LeRobot keeps each policy standalone, beside its shared helpers). ``common``
    itself imports no policy: shared code that needed one would tie every user to it."""
    prefix = f"{root}.policies."
    folders = {m[len(prefix) :].split(".")[0] for m in graph if m.startswith(prefix) and m.count(".") > 2}

    def folder(module: str) -> str | None:
        name = module[len(prefix) :].split(".")[0] if module.startswith(prefix) else None
        return name if name in folders else None

    return sorted(
        (importer, imported)
        for importer, targets in graph.items()
        for imported in targets
        if folder(importer)
        and folder(imported) not in (None, *SHARED_POLICY_FOLDERS)
        and folder(importer) != folder(imported)
    )


def test_no_policy_folder_imports_another():
    assert cross_policy_imports(module_graph("lerobot_cli")) == []


def test_cross_policy_checker_catches_a_planted_violation(tmp_path):
    """A policy importing another's module (here lazily, inside a function) is caught, and so is ``common``
    importing a policy; importing ``common``, a top-level ``policies`` module or its own folder is not."""
    pkg = tmp_path / "lerobot_cli"
    for folder in ("a", "b", "common"):
        (pkg / "policies" / folder).mkdir(parents=True)
        (pkg / "policies" / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "policies" / "__init__.py").write_text("")
    (pkg / "policies" / "config.py").write_text("")
    (pkg / "policies" / "common" / "flow.py").write_text("")
    (pkg / "policies" / "b" / "model.py").write_text("")
    (pkg / "policies" / "a" / "ok.py").write_text(
        "from lerobot_cli.policies.common.flow import x\nfrom lerobot_cli.policies.config import C\n"
        "from lerobot_cli.policies.a import ok\n"
    )
    (pkg / "policies" / "a" / "bad.py").write_text(
        "def f():\n    from lerobot_cli.policies.b.model import M\n    return M\n"
    )
    (pkg / "policies" / "common" / "shared.py").write_text("from lerobot_cli.policies.b import model\n")
    graph = module_graph("lerobot_cli", pkg)
    assert cross_policy_imports(graph) == [
        ("lerobot_cli.policies.a.bad", "lerobot_cli.policies.b.model"),
        ("lerobot_cli.policies.common.shared", "lerobot_cli.policies.b.model"),
    ]

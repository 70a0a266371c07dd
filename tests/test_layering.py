"""The package's layering, checked on its source: the modules that hold features never ask which
backend they run on (each consumer picks its executor once, from the backend), no module is
over ~800 lines, and no import circle exists (type-only and function-level imports included)."""

from __future__ import annotations

import ast
import pathlib

import gpuscalar

PACKAGE = pathlib.Path(gpuscalar.__file__).parent
#: feature modules: they may ask a backend what it is (``host_memory``, ``multi_device``) but
#: never which one it is, nor pick an evaluator themselves
FEATURE_MODULES = ("scalar.py", "math.py", "operators.py", "arrays.py", "reduce.py", "ad.py",
                   "optim/adam.py", "optim/sgd.py", "optim/rmsprop.py", "optim/lion.py",
                   "optim/base.py", "optim/clip.py")
BACKEND_NAMES = {"CUPY", "NUMPY"}


def _backend_branches(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot))
                                                 for op in node.ops):
            names = [c for c in (node.left, *node.comparators) if isinstance(c, ast.Name)]
            if any(n.id in BACKEND_NAMES for n in names):
                found.append(f"{path.name}:{node.lineno}: is {'/'.join(sorted(BACKEND_NAMES))}")
        if isinstance(node, ast.Attribute) and node.attr == "evaluates_on_host":
            found.append(f"{path.name}:{node.lineno}: .evaluates_on_host")
    return found


def test_feature_modules_never_branch_on_the_backend():
    offenders = [hit for name in FEATURE_MODULES for hit in _backend_branches(PACKAGE / name)]
    assert offenders == []


def test_the_branch_checker_finds_a_planted_branch(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(b):\n    if b is CUPY:\n        return b.evaluates_on_host\n")
    assert _backend_branches(planted) == ["planted.py:2: is CUPY/NUMPY",
                                          "planted.py:3: .evaluates_on_host"]


def test_no_module_is_over_800_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 800}
    assert long == {}


def _imports(path: pathlib.Path) -> set[str]:
    """The package modules ``path`` imports, anywhere in it (functions and TYPE_CHECKING
    blocks included), as dotted names under ``gpuscalar``."""
    module = ".".join(("gpuscalar", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    if path.name == "__init__.py":
        module = module.removesuffix(".__init__")
        package = module
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[: len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            found.update(names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpuscalar"):
            found.add(node.module or "")
    return found


def _module_names() -> dict[str, pathlib.Path]:
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("gpuscalar", *path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def test_no_import_circle():
    modules = _module_names()
    edges = {name: {t for t in _imports(path) if t in modules and t != name}
             for name, path in modules.items()}
    # a package's __init__ re-exporting its modules is not a dependency of those modules on it
    for name in modules:
        for target in list(edges[name]):
            if name.startswith(target + "."):
                edges[name].discard(target)
    assert _circles(edges) == []


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle a depth-first walk of ``edges`` meets."""
    circles: list[list[str]] = []

    def visit(node: str, stack: list[str], done: set[str]) -> None:
        for target in sorted(edges[node]):
            if target in stack:
                circles.append(stack[stack.index(target):] + [target])
            elif target not in done:
                visit(target, [*stack, target], done)
        done.add(node)

    done: set[str] = set()
    for name in sorted(edges):
        if name not in done:
            visit(name, [name], done)
    return circles


def test_the_circle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []

"""The package's layering, checked on its source: the modules that hold features never ask which
backend they run on (each consumer picks its executor once, from the backend), no module is
over ~800 lines, no import circle exists (type-only and function-level imports included), and
each device is one folder under gpuscalar/devices/ (a wing) that the rest of the package
reaches through the registry, ``gpuscalar.devices``."""

from __future__ import annotations

import ast
import pathlib

import gpuscalar

PACKAGE = pathlib.Path(gpuscalar.__file__).parent
#: feature modules: they may ask a backend what it is (``host_memory``, ``multi_device``) but
#: never which one it is, nor pick an evaluator themselves
FEATURE_MODULES = ("scalar.py", "math.py", "operators.py", "arrays.py", "reduce.py", "ad.py",
                   "optim/adam.py", "optim/sgd.py", "optim/rmsprop.py", "optim/lion.py",
                   "optim/base.py", "optim/clip.py", "matmul.py", "linalg/_system.py",
                   "sparse.py", "control.py", "bodies.py", "capture.py", "lazy/fusion.py",
                   "optim/executors.py", "deferred.py", "distributed/__init__.py",
                   "distributed/mpi.py", "distributed/nccl.py", "distributed/packing.py")
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


# ---- one wing per device (issue 22) ----------------------------------------------------------

DEVICES = PACKAGE / "devices"
#: the wings: one folder per device under gpuscalar/devices/, each with its root module (the
#: `Backend` subclass and its one instance), the only module of the wing the registry imports
WING_ROOTS = {"host": "gpuscalar.devices.host.backend", "strict": "gpuscalar.devices.strict.device",
              "cupy": "gpuscalar.devices.cupy.backend"}
#: modules outside gpuscalar/devices/ that still import a wing's module rather than the registry
#: (``gpuscalar.devices``): (importing module, wing module)
WING_IMPORTS_OUTSIDE = {
    # the public module `gs.strict`: re-exports the strict device's public names (stays)
    ("gpuscalar.strict", "gpuscalar.devices.strict.device"),
}


def _module_imports(path: pathlib.Path) -> set[str]:
    """The package modules ``path`` imports, anywhere in it, as `_imports` finds them, but with
    ``from package import module`` naming the module, and plain ``import gpuscalar.x`` too."""
    modules = _module_names()
    module = ".".join(("gpuscalar", *path.relative_to(PACKAGE).with_suffix("").parts))
    package = (module.removesuffix(".__init__") if path.name == "__init__.py"
               else module.rsplit(".", 1)[0])
    parts = package.split(".")
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpuscalar"))
            continue
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            target = ".".join(parts[: len(parts) - node.level + 1]
                              + ([node.module] if node.module else []))
        elif (node.module or "").startswith("gpuscalar"):
            target = node.module or ""
        else:
            continue
        for alias in node.names:
            name = f"{target}.{alias.name}"
            found.add(name if name in modules else target)
    return found


def test_one_folder_per_device():
    folders = {p.name for p in DEVICES.iterdir() if (p / "__init__.py").is_file()}
    loose = {p.name for p in DEVICES.glob("*.py")} - {"__init__.py"}
    assert (folders, loose) == (set(WING_ROOTS), set())
    modules = _module_names()
    assert all(root in modules for root in WING_ROOTS.values())


def test_the_registry_imports_the_wing_roots_only():
    wing_imports = {t for t in _module_imports(DEVICES / "__init__.py")
                    if t.startswith("gpuscalar.devices.")}
    assert wing_imports == set(WING_ROOTS.values())


def test_nothing_the_registry_imports_imports_it_back():
    """`test_no_import_circle` drops a module's edge to its own package (gpuscalar.devices, for
    every wing module); here the registry's whole closure (function-level imports, and the
    packages Python initializes on the way, included) must stay below it: a wing root and what
    it reaches never need the registry, nor the features above it."""
    modules = _module_names()
    imported: set[str] = set()  # what the code of the closure imports
    reached: set[str] = set()  # and the packages initialized on the way (not the registry's own)
    todo = ["gpuscalar.devices"]
    while todo:
        for target in _module_imports(modules[todo.pop()]):
            imported.add(target)
            parts = target.split(".")
            for package in (".".join(parts[:n]) for n in range(2, len(parts) + 1)):
                if package in modules and package not in reached | {"gpuscalar.devices"}:
                    reached.add(package)
                    todo.append(package)
    assert "gpuscalar.devices" not in imported
    assert {"gpuscalar.scalar", "gpuscalar.math", "gpuscalar.arrays"}.isdisjoint(reached)


def test_outside_the_wings_a_device_is_reached_through_the_registry():
    found = set()
    for name, path in _module_names().items():
        if name == "gpuscalar.devices" or name.startswith("gpuscalar.devices."):
            continue
        found |= {(name, t) for t in _module_imports(path) if t.startswith("gpuscalar.devices.")}
    assert found == WING_IMPORTS_OUTSIDE


def test_an_executor_slot_is_imported_on_first_use_and_made_once(monkeypatch):
    """`Backend.executor`: the wing module named by the slot, imported when first asked for,
    its factory called once with the backend; an unknown slot names the device and its slots."""
    import sys
    import threading
    import types

    from gpuscalar.backend import Backend

    made = []
    module = types.ModuleType("planted_wing_module")
    module.Loops = lambda backend: made.append(backend) or ("loops of", backend.name)
    monkeypatch.setitem(sys.modules, "planted_wing_module", module)

    class Planted(Backend):
        name = "planted"
        executors = {"loops": "planted_wing_module:Loops"}

    backend = Planted()
    found = []
    threads = [threading.Thread(target=lambda: found.append(backend.executor("loops")))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == [("loops of", "planted")] * 8 and made == [backend]
    try:
        backend.executor("graphs")
    except LookupError as error:
        assert "the planted device has no 'graphs' executor (it has: loops)" in str(error)
    else:
        raise AssertionError("an unknown slot must be a LookupError")


#: the names of the devices' instances (a module outside the wings that names one picks a device)
DEVICE_NAMES = {"NUMPY", "STRICT", "CUPY"}
#: where naming them is the point: the registry and the public `gs.strict` module
DEVICE_NAMERS = {"devices/__init__.py", "strict.py"}


def _names_a_device(path: pathlib.Path) -> list[str]:
    """Each place ``path`` names a device's instance: a bare name, an attribute
    (``devices.CUPY``) or an imported name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Name) and node.id in DEVICE_NAMES:
            found.append(f"{node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in DEVICE_NAMES:
            found.append(f"{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: import {a.name}" for a in node.names
                      if a.name in DEVICE_NAMES]
    return found


def test_no_module_outside_the_wings_names_a_device():
    """Features reach a device through its backend (`backend_of`, `default_backend`,
    `Backend.executor`), and host values through `devices.HOST`, a role: a module outside
    `gpuscalar/devices/` that names NUMPY, STRICT or CUPY has picked a device itself."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        if relative.startswith("devices/") and relative != "devices/__init__.py":
            continue
        if relative in DEVICE_NAMERS:
            continue
        hits = _names_a_device(path)
        if hits:
            offenders[relative] = hits
    assert offenders == {}


def test_the_device_name_checker_finds_each_form(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from .devices import CUPY\nx = devices.STRICT\ny = NUMPY\n")
    assert _names_a_device(planted) == ["1: import CUPY", "2: .STRICT", "3: NUMPY"]

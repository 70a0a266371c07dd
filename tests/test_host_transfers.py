"""Only sync.py (the counted read) and the devices' raw copies it calls (`read_scalar` in
devices/host/backend.py and devices/cupy/backend.py) may move device data to the host. This test
fails if any other module of the package calls a host-transfer API. devices/strict/device.py is the
CPU stand-in device itself: its arrays' own reads of their NumPy data are how it implements (and
declares) the syncs of ``get()``, ``item()``, ``float()``, ..."""

from __future__ import annotations

import ast
import pathlib

import gpuscalar

PACKAGE = pathlib.Path(gpuscalar.__file__).parent
ALLOWED = {"sync.py", "devices/host/backend.py", "devices/cupy/backend.py",
           "devices/strict/device.py"}


def _context_variables(tree: ast.Module) -> set[str]:
    """Module-level names bound to a ``ContextVar(...)`` (their ``.get()`` reads no device)."""
    names = set()
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                and value.func.id == "ContextVar"):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _suspicious(path: pathlib.Path) -> list[str]:
    """Calls of .item() / .tolist() / asnumpy() anywhere, and argument-less .get()
    (the CuPy device->host copy; dict.get always takes a key) on anything but the module's own
    context variables."""
    hits = []
    tree = ast.parse(path.read_text(), filename=str(path))
    context_variables = _context_variables(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        owner = node.func.value
        if name == "get" and isinstance(owner, ast.Name) and owner.id in context_variables:
            continue
        if name in ("item", "tolist", "asnumpy") or (name == "get" and not node.args):
            hits.append(f"{path.name}:{node.lineno}: .{name}()")
    return hits


def test_no_module_but_sync_and_backend_reads_device_data():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).as_posix() not in ALLOWED:
            offenders += _suspicious(path)
    assert offenders == []


def test_the_checker_finds_a_planted_transfer(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from contextvars import ContextVar\nmode = ContextVar('m')\n"
                       "def f(x):\n    y = {}.get('k'), mode.get()\n"
                       "    return x.get(), x.item()\n")
    assert _suspicious(planted) == ["planted.py:5: .get()", "planted.py:5: .item()"]


def test_sync_to_host_is_the_only_caller_of_read_scalar():
    callers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "read_scalar"):
                callers.append(path.name)
    assert callers and set(callers) == {"sync.py"}

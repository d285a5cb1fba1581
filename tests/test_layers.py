"""The package's floors: imports only go down, and private names stay in their file.

Every module of ``fusion_tvm`` is on one floor (``FLOORS``, as drawn in the README's design
section and in shared/STYLE.md); an import (module level, function-local or under
``TYPE_CHECKING``) may name a module on its own floor or a lower one, never a higher one.
Target folders never import each other, and no module imports a ``_private`` name defined in
another file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fusion_tvm"

#: Floor of each module, lowest first; a key names a module (dotted, package-relative) or a
#: package prefix (``frontend.``: every module under it). The longest matching key wins.
FLOORS: dict[str, int] = {}
_LAYOUT = [
    ("ground", ["errors", "threads", "shape_hints", "ops", "attrs", "hardware", "presets",
                "kernel_model"]),
    ("IR", ["tir_analysis", "tir_expr", "online_softmax", "origins", "relax_rewrite",
            "frontend.",
            "targets.tir_writer"]),
    ("engine", ["graph", "chain_stages", "legality", "search", "grouping",
                "baseline", "plan", "explain", "cost_models.base", "tuning_db"]),
    ("models", ["cost_models.roofline", "cost_models.multi_point", "cost_models"]),
    ("targets", ["targets."]),
    ("passes", ["passes."]),
    ("pipeline", ["pipeline"]),
    ("top", ["api", "tuning.", "calibration.", "report", "profile", "verify"]),
    ("faces", ["cli", "__main__", "", "testing.", "examples."]),
]
FLOOR_NAMES = [name for name, _ in _LAYOUT]
for _level, (_name, _keys) in enumerate(_LAYOUT):
    for _key in _keys:
        FLOORS[_key] = _level
#: Folders whose modules never import one another's.
TARGET_FOLDERS = ("targets.llvm_cpu", "targets.cuda", "targets.hls")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def floor_of(module: str) -> int:
    """The floor of a package-relative dotted module name."""
    best, best_len = None, -1
    for key, level in FLOORS.items():
        hit = module == key or (key.endswith(".") and (module.startswith(key)
                                                       or module == key[:-1]))
        if hit and len(key) > best_len:
            best, best_len = level, len(key)
    if best is None:
        raise AssertionError(f"module fusion_tvm.{module} is on no floor: add it to FLOORS")
    return best


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom | ast.Import) -> list[str]:
    """Package-relative names ``node`` imports (modules, or modules' attributes)."""
    out = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == "fusion_tvm" or alias.name.startswith("fusion_tvm."):
                out.append(alias.name[len("fusion_tvm."):] if "." in alias.name else "")
        return out
    if node.level == 0:
        if node.module is None or not (node.module == "fusion_tvm"
                                       or node.module.startswith("fusion_tvm.")):
            return []
        base = node.module[len("fusion_tvm"):].lstrip(".")
    else:
        parts = module.split(".") if module else []
        if not is_pkg:
            parts = parts[:-1]
        up = node.level - 1
        parts = parts[: len(parts) - up] if up else parts
        base = ".".join(parts + ([node.module] if node.module else []))
    for alias in node.names:
        out.append(f"{base}.{alias.name}" if base else alias.name)
    return out


def _modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target_of(name: str, modules: dict[str, Path]) -> str:
    """The module an imported dotted name lives in (``a.b.func`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def imports() -> list[tuple[str, str, str, int]]:
    """(importer, imported module, imported name, line) for every import in the package."""
    modules = _modules()
    found = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _resolve(mod, is_pkg, node):
                    found.append((mod, _target_of(name, modules), name, node.lineno))
    return found


def _folder(module: str) -> str | None:
    return next((f for f in TARGET_FOLDERS if module == f or module.startswith(f + ".")), None)


def layer_violations() -> list[str]:
    bad = []
    for importer, imported, _name, line in imports():
        if imported == importer:
            continue
        src, dst = floor_of(importer), floor_of(imported)
        where = f"fusion_tvm/{importer.replace('.', '/') or '__init__'}.py:{line}"
        if dst > src:
            bad.append(f"{where} ({FLOOR_NAMES[src]}) imports {imported or 'fusion_tvm'} "
                       f"({FLOOR_NAMES[dst]})")
        a, b = _folder(importer), _folder(imported)
        if a and b and a != b:
            bad.append(f"{where}: target folder {a} imports {b}")
    return sorted(set(bad))


def private_imports() -> list[str]:
    bad = []
    modules = _modules()
    for importer, imported, name, line in imports():
        leaf = name.rpartition(".")[2]
        if name in modules or imported == importer:
            continue  # a module (``from . import _util``) is a file, not a private name
        if leaf.startswith("_") and not leaf.startswith("__"):
            bad.append(f"fusion_tvm/{importer.replace('.', '/')}.py:{line} imports {name}")
    return sorted(set(bad))


def import_cycles() -> list[list[str]]:
    """Strongly connected sets of more than one module in the import graph (a package's
    ``__init__`` importing its own submodules counts as an edge like any other)."""
    graph: dict[str, set[str]] = {}
    for importer, imported, _name, _line in imports():
        if imported != importer:
            graph.setdefault(importer, set()).add(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(_modules()):
        if v not in index:
            visit(v)
    return cycles


def test_every_module_is_on_a_floor():
    for mod in _modules():
        floor_of(mod)


def test_imports_only_go_down():
    bad = layer_violations()
    assert not bad, "imports against the floors:\n" + "\n".join(bad)


def test_no_private_name_is_imported_across_files():
    bad = private_imports()
    assert not bad, "private names imported across files:\n" + "\n".join(bad)


def test_no_import_cycles():
    cycles = import_cycles()
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("importer, text, ok", [
    ("cost_models.base", "from ..pipeline import make_pipeline", False),  # engine -> pipeline
    ("graph", "from .errors import FusionTVMError", True),
])
def test_the_checker_sees_an_upward_import(importer, text, ok):
    """The walk resolves relative imports (a checker that sees nothing would pass)."""
    (name,) = _resolve(importer, False, ast.parse(text).body[0])
    imported = _target_of(name, _modules())
    assert (floor_of(imported) <= floor_of(importer)) is ok


def test_the_readme_draws_these_floors():
    """The floors drawn in README.md's design section are the ones this test holds."""
    readme = (PACKAGE.parent / "README.md").read_text()
    block = readme.split("## Design", 1)[1].split("```", 2)[1]
    floors: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if not line.strip():
            continue
        head = line.split()[0]
        if not line.startswith(" ") and head in FLOOR_NAMES:
            current = head
            floors[current] = line[len(head):]
        elif current is not None:
            floors[current] += " " + line
    assert list(floors) == FLOOR_NAMES[::-1], "floors drawn top first, in FLOORS order"
    for name, keys in _LAYOUT:
        for key in keys:
            path = key.rstrip(".").replace(".", "/") or "__init__"
            leaf = path.rpartition("/")[2]
            assert path in floors[name] or leaf in floors[name], (name, key)

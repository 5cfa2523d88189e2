"""The structure of src/cape: the library (cape outside cape.lab) imports torch and the
standard library only, and never the lab; no import cycles; no source file over 400 lines."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cape.lab import arguments

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
MAX_LINES = 400
# What the library may never pull in (the lab's dependencies), checked on sys.modules.
LAB_MODULES = ("yaml", "PIL", "tqdm", "safetensors", "scipy", "matplotlib", "numpy")


# --- the module graph, from the source files alone ---------------------------------------------


def _modules(src: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py under src (a package's name is its __init__.py's)."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module that `from <node.module> import ...` reads, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 > len(package) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Every module an import statement may load: `from a import b` loads a, and a.b if a
    module of that name exists (the caller decides)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _resolve(node, module, is_package)
    return [base] + [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_imports(
    body: list[ast.stmt], functions: bool = False
) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: module level, class bodies, both arms of
    if/try/with, but not `if TYPE_CHECKING:` blocks, nor function bodies unless `functions`
    (imports that run when the function is called)."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _runtime_imports(stmt.body, functions)
            yield from _runtime_imports(stmt.orelse, functions)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from _runtime_imports(block, functions)
        elif isinstance(stmt, (ast.With, ast.ClassDef, ast.For, ast.While)):
            yield from _runtime_imports(stmt.body, functions)
        elif functions and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _runtime_imports(stmt.body, functions)


def _all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    return (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


# what an integration's functions may import when they are called (never at import time): the
# weights format of the library it integrates with, which that library installs
INTEGRATION_CALLS = {"safetensors"}


def library_violations(src: Path, allowed: set[str]) -> list[str]:
    """Imports, anywhere in a file (functions and TYPE_CHECKING too), by which the library
    (cape outside cape.lab) reaches the lab or a third-party module outside `allowed`; inside
    the functions of `cape.integrations`, `INTEGRATION_CALLS` too."""
    found = []
    for module, path in _modules(src).items():
        if not module.startswith("cape") or module == "cape.lab" or module.startswith("cape.lab."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        at_import = {id(n) for n in _runtime_imports(tree.body)}
        for node in _all_imports(tree):
            called = id(node) not in at_import and module.startswith("cape.integrations")
            ok = allowed | INTEGRATION_CALLS if called else allowed
            for name in _names(node, module, path.name == "__init__.py"):
                top = name.partition(".")[0]
                where = f"{path.relative_to(src)}:{node.lineno}"
                if name == "cape.lab" or name.startswith("cape.lab."):
                    found.append(f"{where} imports the lab ({name})")
                elif top != "cape" and top not in ok:
                    found.append(f"{where} imports {name}, neither torch nor the standard library")
    return sorted(set(found))


def import_graph(src: Path, functions: bool = False) -> dict[str, set[str]]:
    """Module -> the modules its import executes (with `functions`, or its functions' imports
    when called). Importing a.b.c runs a, a.b and a.b.c; an edge to the importer's own ancestor
    package is left out: Python initialises a package before any of its submodules, so that
    import finds it in sys.modules and runs nothing."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        tree = ast.parse(path.read_text(), str(path))
        for node in _runtime_imports(tree.body, functions):
            for name in _names(node, module, path.name == "__init__.py"):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target in modules and target not in ancestors:
                        graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph has a few hundred nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:  # breadth-first from the first member back to itself
        start, members = component[0], set(component)
        paths = {w: [start, w] for w in graph[start] if w in members}
        queue = list(paths)
        while start not in paths:
            v = queue.pop(0)
            for w in sorted(graph[v] & members):
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    queue.append(w)
        cycles.append(paths[start])
    return cycles


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


# --- the checks on the helpers: each can fail ---------------------------------------------------


def test_library_scan_finds_lab_and_third_party_imports(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "cape/__init__.py": "from . import models\n",
            "cape/lab/__init__.py": "import numpy\n",  # the lab may
            "cape/models/__init__.py": "def f():\n    from ..lab import io\n",
            "cape/models/vit.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    import cape.lab.cli\nimport torch, numpy\nfrom . import attention\n",
            "cape/models/attention.py": "from .. import lab\nfrom cape import build\n",
        },
    )
    allowed = set(sys.stdlib_module_names) | {"torch"}
    assert library_violations(src, allowed) == [
        "cape/models/__init__.py:2 imports the lab (cape.lab)",
        "cape/models/__init__.py:2 imports the lab (cape.lab.io)",
        "cape/models/attention.py:1 imports the lab (cape.lab)",
        "cape/models/vit.py:3 imports the lab (cape.lab.cli)",
        "cape/models/vit.py:4 imports numpy, neither torch nor the standard library",
    ]


def test_cycle_finder_keeps_real_cycles_only(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .a import A\nfrom . import c\n",
            "pkg/a.py": "from pkg import b\nA = 1\n",  # pkg: an ancestor, not an edge
            "pkg/b.py": "from .a import A\n",  # a <-> b: a real cycle
            "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from .d import D\ndef f():\n    from .d import D\n",
            "pkg/d.py": "from .c import f\n",  # c -> d only for type checkers and inside a function
        },
    )
    graph = import_graph(src)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.c"] == set()
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.a"]]


# --- the project ----------------------------------------------------------------------------


def test_library_imports_only_torch_and_never_the_lab() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch"}
    assert library_violations(SRC, allowed) == []


def test_library_import_loads_no_lab_module() -> None:
    # A bare `import torch` loads numpy and tqdm when they are installed, so only what
    # `import cape` adds after torch counts here; the AST scan above covers the rest.
    code = (
        "import json, sys\nimport torch\nbefore = set(sys.modules)\n"
        "import cape, cape.functional, cape.encodings, cape.models\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
        "print(cape.CAPE1d(8)(torch.zeros(2, 5, 8)).shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = json.loads(out.stdout.splitlines()[0])
    assert "cape.models" in added  # the check sees what it should
    assert out.stdout.splitlines()[1] == "torch.Size([2, 5, 8])"
    assert [m for m in added if m.startswith("cape.lab") or m.split(".")[0] in LAB_MODULES] == []


@pytest.mark.parametrize("functions", [False, True], ids=["module-level", "with-functions"])
def test_no_import_cycles(functions: bool) -> None:
    graph = import_graph(SRC, functions)
    assert graph["cape"] >= {"cape.functional", "cape.models"}  # the graph is built
    cycles = import_cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_function_level_imports_are_in_the_graph(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import B\n",
        "pkg/b.py": "def f():\n    from .a import A\n    return A\nB = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert import_cycles(import_graph(tmp_path)) == []
    assert import_cycles(import_graph(tmp_path, functions=True)) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_library_functions_are_simple() -> None:
    """No function of the library (outside the lab) over ruff's McCabe complexity 12."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "C901", "--config",
         "lint.mccabe.max-complexity=12", "--exclude", "src/cape/lab", "src/cape"],
        capture_output=True, text=True, cwd=SRC.parent,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout


def test_no_source_file_over_400_lines() -> None:
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 50
    long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"files over {MAX_LINES} lines: {long}"


def test_cli_guard_covers_every_third_party_module_the_lab_imports() -> None:
    # `cape` turns a missing module of arguments._EXTRA_OF_MODULE into one line naming its extra
    lab = {m: p for m, p in _modules(SRC).items() if m.startswith("cape.lab")}
    imported = {
        name.partition(".")[0]
        for module, path in lab.items()
        for node in _all_imports(ast.parse(path.read_text()))
        for name in _names(node, module, path.name == "__init__.py")
    }
    third_party = imported - set(sys.stdlib_module_names) - {"cape", "torch"}
    assert "numpy" in third_party and third_party <= set(arguments._EXTRA_OF_MODULE), third_party

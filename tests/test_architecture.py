"""The project's shape, checked from the source (issue "One shape for the whole project").

Every module of the package's folders (pyproject.toml's package-dir) is parsed with `ast` (nothing is imported), its
imports are resolved (relative ones against its own package) and grouped by
folder, and five rules are asserted:

(a) no cycle between folders;
(b) the layers: spec < reference < {gpu, proofs, monitor} < cli; a folder
    imports only folders of lower layers (so reference imports none of gpu,
    proofs and monitor, and folders of one layer do not import each other); the
    package's own
    `cli/package/__init__.py` imports nothing of the project and
    `cli/package/__main__.py` sits above everything;
(c) no private name (a leading underscore, not a dunder) crosses modules: neither
    `from m import _x` nor `m._x` on an imported module;
(d) argparse stays in the command line: outside cli/ no module imports
    argparse, and no function
    takes an `args` parameter or one annotated as a Namespace;
(e) imports within a folder are relative (`from .x import`), across folders absolute
    (`from schedspec.reference.scenario import`).

The checker is plain functions over {module name: source}, so the tests at the
bottom feed it planted violations: it cannot pass by finding nothing.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "schedspec"
REPO = Path(__file__).resolve().parent.parent


def package_dirs(repo: Path = REPO) -> dict[str, Path]:
    """{package: folder} from pyproject.toml's [tool.setuptools.package-dir]: the
    layers are folders at the root, installed as one package."""
    import tomllib

    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {package: repo / folder for package, folder in mapping.items()}


# The package's own top-level modules are folders of their own.
INIT, MAIN = "__init__", "__main__"
LAYERS: dict[str, int] = {
    INIT: 0,
    "spec": 1,
    "reference": 2,
    "gpu": 3, "proofs": 3, "monitor": 3,
    "cli": 4,
    MAIN: 5,
}
# Imports between folders of one layer that are allowed.
SAME_LAYER_ALLOWED: set[tuple[str, str]] = set()
# Modules outside cli/ that may import argparse.
ARGPARSE_ALLOWED: set[str] = set()


@dataclass(frozen=True)
class Source:
    text: str
    is_package: bool = False  # an __init__.py: its relative imports resolve against itself


@dataclass(frozen=True)
class Import:
    importer: str  # module name
    target: str  # the module imported (a project module when it is one)
    name: str | None  # `from target import name`: the name; None for `import target`
    line: int


def discover(dirs: dict[str, Path] | None = None) -> dict[str, Source]:
    """{dotted module name: Source} of every .py file of the package's folders; a
    file belongs to the package of the deepest folder that holds it."""
    dirs = package_dirs() if dirs is None else dirs
    modules = {}
    for package, root in dirs.items():
        for path in sorted(root.rglob("*.py")):
            owner = max((d for d in dirs.values() if d in path.parents), key=lambda d: len(d.parts))
            if owner != root:
                continue
            parts = [*package.split("."), *path.relative_to(root).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            modules[".".join(parts)] = Source(path.read_text(encoding="utf-8"), is_package)
    return modules


def folder(module: str) -> str:
    """The folder a module belongs to: `schedspec.reference.campaign` -> reference;
    the package's top-level modules are their own (`schedspec` -> __init__)."""
    parts = module.split(".")
    if parts == [PACKAGE]:
        return INIT
    return parts[1]


def _package_of(module: str, src: Source) -> str:
    return module if src.is_package else module.rpartition(".")[0]


def resolve_from(module: str, src: Source, node: ast.ImportFrom) -> str:
    """The absolute module of a `from ... import` statement."""
    if not node.level:
        return node.module or ""
    base = _package_of(module, src).split(".")
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(modules: dict[str, Source]) -> list[Import]:
    """Every import statement of every module, resolved.  `from pkg import sub`
    where pkg.sub is a module counts as importing pkg.sub."""
    found = []
    for module, src in modules.items():
        for node in ast.walk(ast.parse(src.text)):
            if isinstance(node, ast.Import):
                found += [Import(module, a.name, None, node.lineno) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = resolve_from(module, src, node)
                if target == "__future__":
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if sub in modules:
                        found.append(Import(module, sub, None, node.lineno))
                    else:
                        found.append(Import(module, target, a.name, node.lineno))
    return found


def _in_project(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def folder_graph(modules: dict[str, Source]) -> dict[tuple[str, str], list[str]]:
    """{(importer folder, imported folder): ["module:line -> target", ...]} between
    different folders of the project."""
    edges: dict[tuple[str, str], list[str]] = {}
    for imp in imports(modules):
        if not _in_project(imp.target):
            continue
        a, b = folder(imp.importer), folder(imp.target)
        if a != b:
            edges.setdefault((a, b), []).append(f"{imp.importer}:{imp.line} -> {imp.target}")
    return edges


def folder_cycles(edges) -> list[list[str]]:
    """Cycles of the folder graph (one per strongly connected component of size > 1
    or with a self loop), each as a sorted list of folders."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

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
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def layer_violations(edges) -> list[str]:
    """Imports of a folder that is not of a lower layer (or of an unknown folder)."""
    bad = []
    for (a, b), where in sorted(edges.items()):
        if a not in LAYERS or b not in LAYERS:
            bad.append(f"{a} -> {b}: folder not in the layer table ({where[0]})")
        elif LAYERS[b] >= LAYERS[a] and (a, b) not in SAME_LAYER_ALLOWED:
            bad.append(f"{a} (layer {LAYERS[a]}) imports {b} (layer {LAYERS[b]}): {', '.join(where)}")
    return bad


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(tree: ast.AST, module: str, src: Source, modules: dict[str, Source]) -> dict[str, str]:
    """{local name: module} for the names a file binds to modules (any scope)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    bound[a.asname] = a.name
                else:
                    top = a.name.partition(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            target = resolve_from(module, src, node)
            for a in node.names:
                if f"{target}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{target}.{a.name}"
    return bound


def private_crossings(modules: dict[str, Source]) -> list[str]:
    """`from m import _x`, and `m._x` on a module name, in any module."""
    bad = [f"{imp.importer}:{imp.line}: from {imp.target} import {imp.name}"
           for imp in imports(modules) if imp.name is not None and _private(imp.name)]
    # `from pkg import _sub` / `import pkg._sub`: a private module of another package.
    bad += [f"{imp.importer}:{imp.line}: import {imp.target}"
            for imp in imports(modules) if imp.name is None and _private(imp.target.rpartition(".")[2])
            and imp.importer.rpartition(".")[0] != imp.target.rpartition(".")[0]]
    for module, src in modules.items():
        tree = ast.parse(src.text)
        bound = _module_names(tree, module, src, modules)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain = node.value
                while isinstance(chain, ast.Attribute):
                    chain = chain.value
                if isinstance(chain, ast.Name) and chain.id in bound:
                    bad.append(f"{module}:{node.lineno}: {ast.unparse(node)} (module {bound[chain.id]})")
    return sorted(set(bad))


def namespace_leaks(modules: dict[str, Source]) -> list[str]:
    """argparse outside the command line: an import of it (but ARGPARSE_ALLOWED), a
    parameter named `args` (not `*args`) or annotated as a Namespace."""
    bad = []
    for imp in imports(modules):
        if (imp.target == "argparse" or imp.target.startswith("argparse.")) and folder(imp.importer) != "cli" \
                and imp.importer not in ARGPARSE_ALLOWED:
            bad.append(f"{imp.importer}:{imp.line}: imports argparse")
    for module, src in modules.items():
        if folder(module) == "cli":
            continue
        for node in ast.walk(ast.parse(src.text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            a = node.args
            for p in a.posonlyargs + a.args + a.kwonlyargs:
                annotation = ast.unparse(p.annotation) if p.annotation is not None else ""
                if p.arg == "args" or "Namespace" in annotation:
                    name = getattr(node, "name", "<lambda>")
                    bad.append(f"{module}:{node.lineno}: {name}({p.arg}{': ' + annotation if annotation else ''})")
    return bad


def convention_violations(modules: dict[str, Source]) -> list[str]:
    """Project imports that are absolute within a folder or relative across folders
    (the package's top-level modules import absolutely)."""
    bad = []
    for module, src in modules.items():
        for node in ast.walk(ast.parse(src.text)):
            if isinstance(node, ast.ImportFrom):
                targets, relative = [resolve_from(module, src, node)], node.level > 0
            elif isinstance(node, ast.Import):
                targets, relative = [a.name for a in node.names], False
            else:
                continue
            for target in targets:
                if not _in_project(target) or folder(module) in (INIT, MAIN):
                    continue
                same = target != PACKAGE and folder(target) == folder(module)
                if same and not relative:
                    bad.append(f"{module}:{node.lineno}: absolute import of {target}, in its own folder")
                elif relative and not same:
                    bad.append(f"{module}:{node.lineno}: relative import of {target}, another folder")
    return bad


# --- the project -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def project() -> dict[str, Source]:
    modules = discover()
    assert f"{PACKAGE}.spec.scheduler" in modules and f"{PACKAGE}.cli.main" in modules, sorted(modules)
    return modules


def test_every_folder_has_a_layer(project):
    folders = {folder(m) for m in project}
    assert folders <= set(LAYERS), f"folders without a layer: {sorted(folders - set(LAYERS))}"


def test_imports_are_resolved(project):
    """Sanity: the graph sees the imports we know are there, relative ones included."""
    edges = folder_graph(project)
    assert ("reference", "spec") in edges
    assert ("cli", "reference") in edges
    assert (MAIN, "cli") in edges
    found = {(i.importer, i.target) for i in imports(project)}
    # reference/campaign.py: `from .compare import ...`
    assert (f"{PACKAGE}.reference.campaign", f"{PACKAGE}.reference.compare") in found


def test_no_cycle_between_folders(project):
    assert folder_cycles(folder_graph(project)) == []


def test_layers(project):
    assert layer_violations(folder_graph(project)) == []


def test_no_private_name_crosses_modules(project):
    assert private_crossings(project) == []


def test_no_argparse_outside_the_command_line(project):
    assert namespace_leaks(project) == []


def test_relative_within_a_folder_absolute_across(project):
    assert convention_violations(project) == []


# --- the checker catches what it is for ---------------------------------------------------------

def _fake(files: dict[str, str]) -> dict[str, Source]:
    """{"reference/campaign.py": source, ...} as discover() would read it under schedspec/."""
    modules = {}
    for path, text in files.items():
        parts = [PACKAGE, *Path(path).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = Source(text, is_package)
    return modules


FAKE_BASE = {
    "spec/config.py": "X = 1\n_Y = 2\n",
    "reference/campaign.py": "from .compare import f\nfrom schedspec.spec.config import X\n",
    "reference/compare.py": "def f(): pass\n",
}


def _with(files: dict[str, str]) -> dict[str, Source]:
    return _fake({**FAKE_BASE, **files})


def test_fake_project_is_clean():
    modules = _fake(FAKE_BASE)
    edges = folder_graph(modules)
    assert set(edges) == {("reference", "spec")}
    assert folder_cycles(edges) == [] and layer_violations(edges) == []
    assert private_crossings(modules) == [] and namespace_leaks(modules) == []
    assert convention_violations(modules) == []


def test_relative_imports_resolve():
    modules = _with({"gpu/campaign.py": "from ..reference.campaign import f\nfrom . import sweep\n",
                     "gpu/sweep.py": "from .. import spec\n",
                     "gpu/__init__.py": "from .sweep import x\nfrom . import sweep\n"})
    pairs = {(i.importer, i.target) for i in imports(modules)}
    assert ("schedspec.reference.campaign", "schedspec.reference.compare") in pairs
    assert ("schedspec.gpu.campaign", "schedspec.reference.campaign") in pairs
    assert ("schedspec.gpu.campaign", "schedspec.gpu.sweep") in pairs
    assert ("schedspec.gpu", "schedspec.gpu.sweep") in pairs  # a package resolves against itself
    assert ("schedspec.gpu.sweep", "schedspec") in pairs  # `from .. import spec`: no spec/__init__.py here
    assert ("gpu", "reference") in folder_graph(modules)


def test_catches_a_cycle_and_a_layer_violation():
    modules = _with({"spec/state.py": "from schedspec.reference.compare import f\n"})
    edges = folder_graph(modules)
    assert folder_cycles(edges) == [["reference", "spec"]]
    assert any(v.startswith("spec (layer 1) imports reference") for v in layer_violations(edges))


def test_catches_same_layer_and_upward_imports():
    modules = _with({"reference/x.py": "from schedspec.gpu import batch\n", "gpu/batch.py": "",
                     "proofs/y.py": "import schedspec.monitor.scope\n", "monitor/scope.py": "",
                     "reference/z.py": "from schedspec import __main__\n", "__main__.py": "",
                     "__init__.py": "from schedspec.spec.config import X\n",
                     "gpu/app.py": "from schedspec.cli import common\n", "cli/common.py": "",
                     "cli/explore.py": "from schedspec.cli.page.app import create_app\n"})
    bad = layer_violations(folder_graph(modules))
    assert any(v.startswith("reference (layer 2) imports gpu") for v in bad)
    assert any(v.startswith("proofs (layer 3) imports monitor") for v in bad)
    assert any(v.startswith("reference (layer 2) imports __main__") for v in bad)
    assert any(v.startswith("__init__ (layer 0) imports spec") for v in bad)
    assert any(v.startswith("gpu (layer 3) imports cli") for v in bad)
    assert not any(v.startswith("cli (layer 4)") for v in bad)  # a subpackage of cli is cli


def test_catches_an_unknown_folder():
    modules = _with({"extra/m.py": "from schedspec.spec.config import X\n"})
    assert any("not in the layer table" in v for v in layer_violations(folder_graph(modules)))


def test_catches_private_names():
    modules = _with({
        "reference/a.py": "from schedspec.spec.config import _Y\n",
        "reference/b.py": "from .compare import f as _f, __all__\n",  # a private alias is fine
        "reference/c.py": "import schedspec.spec.config as cfg\ndef g():\n    return cfg._Y\n",
        "reference/d.py": "from schedspec.spec import config\nz = config._Y\n",
        "reference/e.py": "from . import compare\nw = compare._h.x\nv = compare.__doc__\n",
        "reference/f.py": "import schedspec.spec.config\nu = schedspec.spec.config._Y\n",
        "reference/g.py": "class C:\n    def m(self):\n        return self._y\n",  # an attribute, no module
        "reference/_h.py": "",
        "gpu/i.py": "from schedspec.reference import _h\n",
    })
    bad = private_crossings(modules)
    assert bad == sorted([
        "schedspec.reference.a:1: from schedspec.spec.config import _Y",
        "schedspec.reference.c:3: cfg._Y (module schedspec.spec.config)",
        "schedspec.reference.d:2: config._Y (module schedspec.spec.config)",
        "schedspec.reference.e:2: compare._h (module schedspec.reference.compare)",
        "schedspec.reference.f:2: schedspec.spec.config._Y (module schedspec)",
        "schedspec.gpu.i:1: import schedspec.reference._h",
    ]), bad


def test_catches_argparse_outside_the_command_line():
    modules = _with({
        "reference/a.py": "import argparse\n",
        "gpu/b.py": "from argparse import Namespace\n",
        "proofs/c.py": "def run(args, n): pass\n",
        "monitor/d.py": "def run(opts: 'argparse.Namespace'): pass\n",
        "cli/args.py": "import argparse\n",  # the command line's argparse types
        "cli/diff.py": "import argparse\ndef cmd(args: argparse.Namespace): pass\n",  # the command line
        "spec/e.py": "def f(*args, **kwargs): pass\n",  # varargs are no Namespace
    })
    assert sorted(namespace_leaks(modules)) == sorted([
        "schedspec.reference.a:1: imports argparse",
        "schedspec.gpu.b:1: imports argparse",
        "schedspec.proofs.c:1: run(args)",
        "schedspec.monitor.d:1: run(opts: 'argparse.Namespace')",
    ])


def test_catches_import_convention_violations():
    modules = _with({
        "reference/a.py": "from schedspec.reference.compare import f\n",  # absolute, same folder
        "reference/b.py": "from ..spec.config import X\n",  # relative, other folder
        "reference/c.py": "import json, schedspec.reference.compare\n",  # absolute, same folder
        "gpu/d.py": "from schedspec.reference.compare import f\nfrom . import e\n",  # both fine
        "gpu/e.py": "",
        "cli/f.py": "from .page import app\n",  # a subpackage of its own folder: relative
    })
    assert sorted(convention_violations(modules)) == sorted([
        "schedspec.reference.a:1: absolute import of schedspec.reference.compare, in its own folder",
        "schedspec.reference.b:1: relative import of schedspec.spec.config, another folder",
        "schedspec.reference.c:1: absolute import of schedspec.reference.compare, in its own folder",
    ])
    assert layer_violations(folder_graph(modules)) == []


def test_architecture_md_names_every_module():
    """ARCHITECTURE.md's module table is scripts/architecture-table.py's output for
    the tree as it is: a module added, moved or renamed without the table fails here."""
    import subprocess
    import sys

    script = REPO / "scripts" / "architecture-table.py"
    p = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    table = (REPO / "ARCHITECTURE.md").read_text()
    named = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `") and ".py`" in line}
    files = {str(p.relative_to(REPO)) for d in package_dirs().values() for p in d.rglob("*.py")
             if "__pycache__" not in p.parts}
    assert files <= named, sorted(files - named)


# --- no function a reader cannot take in at once -------------------------------------------------

LONGEST_FUNCTION = 80  # lines of a def, decorators excluded


def long_functions(modules: dict[str, Source], limit: int = LONGEST_FUNCTION) -> list[str]:
    """`module.function: N lines` for every function (methods and nested ones too)
    longer than `limit` lines."""
    found = []
    for module, src in modules.items():
        for node in ast.walk(ast.parse(src.text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{module}.{node.name}: {lines} lines")
    return sorted(found)


def test_no_function_over_80_lines(project):
    assert long_functions(project) == []


def test_catches_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(LONGEST_FUNCTION))
    modules = _fake({"spec/a.py": f"def long():\n{body}\n\ndef short():\n    return 1\n",
                     "gpu/b.py": f"class C:\n    def m(self):\n{body.replace('    ', '        ')}"})
    assert long_functions(modules) == ["schedspec.gpu.b.m: 81 lines", "schedspec.spec.a.long: 81 lines"]

"""Mutants of the spec (or of the torch implementation), built from the AST.

A `Mutation` names a function by its place in the package (`scheduler.admit`,
`block_pool.PoolWork.free`) and one piece of code in it, an expression or one or
more statements, and what to put there instead.  The piece is found by its syntax
tree, not its text, so comments, line breaks and spacing may change freely; it
must occur exactly once in that function, so a mutant can never silently be the
unchanged code.  `mutated(...)` swaps the broken functions in for the duration of
a `with` block, everywhere the package refers to them, and puts the originals
back afterwards.
"""

from __future__ import annotations

import __future__
import ast
import contextlib
import functools
import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Iterator, Sequence


@dataclass(frozen=True)
class Mutation:
    target: str  # "module.function" or "module.Class.method", relative to the package
    old: str
    new: str


def _dump(node: ast.AST) -> str:
    return ast.dump(node, include_attributes=False)


def _as_nodes(code: str) -> tuple[str, list[ast.AST]]:
    """('expr', [node]) for an expression, else ('stmts', statements)."""
    code = textwrap.dedent(code).strip()
    try:
        return "expr", [ast.parse(code, mode="eval").body]
    except SyntaxError:
        return "stmts", ast.parse(code).body


class _Replace(ast.NodeTransformer):
    def __init__(self, old: str, new: str):
        # Expression for expression when both are one; otherwise statements.
        self.kind = "expr" if _as_nodes(old)[0] == _as_nodes(new)[0] == "expr" else "stmts"
        parse = _as_nodes if self.kind == "expr" else (lambda code: ("stmts", ast.parse(textwrap.dedent(code).strip()).body))
        self.old, self.new = parse(old)[1], parse(new)[1]
        self.old_dumps = [_dump(n) for n in self.old]
        self.count = 0

    def visit(self, node):
        if self.kind == "expr" and isinstance(node, ast.expr) and _dump(node) == self.old_dumps[0]:
            self.count += 1
            return self.new[0]
        node = self.generic_visit(node)
        if self.kind == "stmts":
            for name in ("body", "orelse", "finalbody"):
                stmts = getattr(node, name, None)
                if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                    setattr(node, name, self._splice(stmts))
        return node

    def _splice(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        k = len(self.old_dumps)
        out, i = [], 0
        while i < len(stmts):
            if [_dump(s) for s in stmts[i:i + k]] == self.old_dumps:
                self.count += 1
                out.extend(self.new)
                i += k
            else:
                out.append(stmts[i])
                i += 1
        return out or [ast.Pass()]


def _resolve(package: str, target: str):
    """(module, owner the function is an attribute of, its name, the function)."""
    parts = target.split(".")
    module = importlib.import_module(f"{package}.{parts[0]}")
    owner = module
    for name in parts[1:-1]:
        owner = getattr(owner, name)
    return module, owner, parts[-1], getattr(owner, parts[-1])


@functools.lru_cache(maxsize=None)
def build(package: str, *ms: Mutation):
    """The function with every mutation of `ms` (one target) in it, compiled in its
    own module's globals, from the original source."""
    (target,) = {m.target for m in ms}
    module, owner, name, fn = _resolve(package, target)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    (fdef,) = tree.body
    fdef.decorator_list = []
    for m in ms:
        replacer = _Replace(m.old, m.new)
        replacer.visit(fdef)
        assert replacer.count == 1, f"{m.target}: {m.old!r} occurs {replacer.count} times"
    ast.fix_missing_locations(tree)
    namespace: dict = {}
    code = compile(tree, f"<mutant of {target}>", "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)
    exec(code, module.__dict__, namespace)
    return owner, name, fn, namespace[name]


def mutated_source(source: str, function: str, old: str, new: str) -> str:
    """A module's source with one mutation in top-level `function`, for tools that
    read files (CrossHair); comments are lost, docstrings kept."""
    tree = ast.parse(source)
    (fdef,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
    replacer = _Replace(old, new)
    replacer.visit(fdef)
    assert replacer.count == 1, f"{function}: {old!r} occurs {replacer.count} times"
    return ast.unparse(ast.fix_missing_locations(tree))


@contextlib.contextmanager
def mutated(mutations: Sequence[Mutation], package: str = "schedspec.spec",
            module: str = "scheduler") -> Iterator:
    """`package.module` with the mutations in force, for the `with` block."""
    swaps = []  # (object, attribute, original)
    by_target: dict[str, list[Mutation]] = {}  # several mutations of one function: all in it
    for m in mutations:
        by_target.setdefault(m.target, []).append(m)
    built = [build(package, *ms) for ms in by_target.values()]  # each from the original source
    try:
        for owner, name, original, broken in built:
            swaps.append((owner, name, original))
            setattr(owner, name, broken)
            # Modules that imported the function by name hold it too.
            for modname, mod in list(sys.modules.items()):
                if modname.startswith(package + ".") and mod is not owner \
                        and getattr(mod, name, None) is original:
                    swaps.append((mod, name, original))
                    setattr(mod, name, broken)
        yield importlib.import_module(f"{package}.{module}")
    finally:
        for obj, name, original in reversed(swaps):
            setattr(obj, name, original)

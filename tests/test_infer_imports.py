"""The shape of `strata_ref.infer`: no import circle between its modules,
and the architectures named in one place (`infer/archs.py`).

Every import statement of every module of the package counts, those
inside functions too (a lazy import is still a dependency; the package's
old `model` -> `dense` -> `model` circle went through one), read from
the source with `ast`, so nothing is imported to check it.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = "strata_ref.infer"
DIR = Path(__file__).resolve().parents[1] / "strata_ref" / "infer"


def _modules() -> dict:
    """module name -> parsed source, for every module of the package."""
    out = {}
    for f in sorted(DIR.glob("*.py")):
        name = PKG if f.stem == "__init__" else f"{PKG}.{f.stem}"
        out[name] = ast.parse(f.read_text(), str(f))
    return out


def _edges(name: str, tree, modules: dict) -> set:
    """The package's modules that module `name` imports (anywhere in it)."""
    package = name if name == PKG else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # `from . import trace` imports the submodule; `from . import load`
            # the package's name
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        out |= {t for t in targets if t in modules and t != name}
    return out


def _cycle(graph: dict):
    """One import circle of `graph` as a list of modules, or None."""
    state = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n, path + [n])
                if found:
                    return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m, [m])
            if found:
                return found
    return None


def _graph():
    mods = _modules()
    return {m: _edges(m, t, mods) for m, t in mods.items()}


def test_the_walker_finds_a_circle():
    # the check itself: a circle through a lazy import is found
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    src = {f"{PKG}.x": ast.parse("def f():\n    from .y import g\n"),
           f"{PKG}.y": ast.parse("from . import x\n")}
    g = {m: _edges(m, t, src) for m, t in src.items()}
    assert g == {f"{PKG}.x": {f"{PKG}.y"}, f"{PKG}.y": {f"{PKG}.x"}}
    assert _cycle(g) is not None


def test_no_import_circle_in_infer():
    graph = _graph()
    assert f"{PKG}.model" in graph and f"{PKG}.dense" in graph[f"{PKG}.loader"] | {f"{PKG}.dense"}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_spec_table_is_the_bottom_and_the_loader_the_top():
    graph = _graph()
    assert graph[f"{PKG}.archs"] == set()
    # no graph module reaches up to the loader or the package's entry points
    for m, deps in graph.items():
        if m not in (PKG, f"{PKG}.loader"):
            assert not deps & {PKG, f"{PKG}.loader"}, m


def _strings(tree) -> set:
    """The string constants of a module, its docstrings left out."""
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docs.add(id(body[0].value))
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


# the tokenizer's strings are `tokenizer.ggml.model` / `tokenizer.ggml.pre`
# values ("llama", "qwen2"), another namespace than `general.architecture`
_NOT_ARCH_NAMES = {f"{PKG}.archs", f"{PKG}.tokenizer"}


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m not in _NOT_ARCH_NAMES))
def test_architectures_are_named_only_in_the_spec_table(module):
    from strata_ref.infer.archs import ARCHS
    named = _strings(_modules()[module]) & set(ARCHS)
    assert not named, f"{module} names {sorted(named)}: read an ArchSpec field instead"

"""The package's shape: no import cycle between kleidipy's modules, the layers (ops below the compiled graph, the
graph below the runtime) import nothing above them, the core never imports a family, the emulator or the runtime,
every family package holds its parts and declares them, and modules stay small."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import kleidipy
from kleidipy.kernels.catalogue import families

ROOT = Path(kleidipy.__file__).resolve().parent
#: modules allowed past MAX_CODE_LINES, with the reason
LONG_MODULES = {"kleidipy.runtime.tokenizer": "the three pre-tokenizers and BPE/SPM state machines of llama.cpp"}
#: a module's lines of code (docstrings, comments and blank lines not counted)
MAX_CODE_LINES = 420


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, type_checking: bool = False) -> set[str]:
    """The kleidipy modules ``name`` imports anywhere in its text (functions included; annotations-only imports
    under ``if TYPE_CHECKING:`` only with ``type_checking``); ``from pkg import x`` counts as importing the submodule
    pkg.x when x is one, else pkg."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    type_only = {  # `if TYPE_CHECKING:` imports are for annotations only: no import at run time
        id(n)
        for block in ast.walk(tree)
        if not type_checking and isinstance(block, ast.If) and getattr(block.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("kleidipy")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if not base.startswith("kleidipy"):
                continue
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
#: the same with the annotations-only imports: what a module names at all, which the layers and cycles go by
NAMED = {name: _imports(name, path, type_checking=True) for name, path in MODULES.items()}
#: package -> the packages above it, which it must not import, even for annotations (the ops both executions call,
#: below the compiled graph, below the runtime: as ggml sits below llama.cpp's model code; the observer interface
#: both report to, below both)
LAYERS = {
    "kleidipy.ops": ("kleidipy.graph", "kleidipy.runtime"),
    "kleidipy.observer": ("kleidipy.graph", "kleidipy.runtime"),
    "kleidipy.graph": ("kleidipy.runtime",),
}


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), annotation-only imports included: two
    modules that name each other are one piece, even if only one imports the other at run time."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in NAMED[v]:
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
                out.append(sorted(comp))

    for v in NAMED:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    assert _cycles() == []


def test_the_cycle_check_sees_a_cycle() -> None:
    """The check itself: two modules importing each other are one cycle."""
    saved = {k: set(v) for k, v in NAMED.items()}
    try:
        NAMED["kleidipy.core.buffers"].add("kleidipy.core.matmul")
        assert any("kleidipy.core.buffers" in c and "kleidipy.core.matmul" in c for c in _cycles())
    finally:
        NAMED.clear()
        NAMED.update(saved)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if any(_in(m, p) for p in LAYERS)))
def test_layers_import_nothing_above(name: str) -> None:
    above = next(up for p, up in LAYERS.items() if _in(name, p))
    wrong = {m for m in NAMED[name] if any(_in(m, p) for p in above)}
    assert not wrong, f"{name} imports {sorted(wrong)}, above it"


def test_the_layer_check_counts_annotation_imports(tmp_path: Path) -> None:
    """An import under ``if TYPE_CHECKING:`` names the module all the same: the layer and cycle checks see it."""
    path = tmp_path / "annotated.py"
    path.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from kleidipy.runtime import layers\n")
    assert _imports("kleidipy.graph.annotated", path) == set()
    assert _imports("kleidipy.graph.annotated", path, type_checking=True) == {"kleidipy.runtime.layers"}


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("kleidipy.core")))
def test_core_imports_only_core(name: str) -> None:
    outside = {m for m in GRAPH[name] if not m.startswith("kleidipy.core") and m != "kleidipy.errors"}
    assert not outside, f"{name} imports {sorted(outside)}"


@pytest.mark.parametrize("name", sorted(m for m in MODULES if m.startswith("kleidipy.emulator")))
def test_emulator_imports_no_family(name: str) -> None:
    assert not {m for m in GRAPH[name] if m.startswith("kleidipy.kernels")}, GRAPH[name]


FAMILY_PACKAGES = {f"kleidipy.kernels.{f.name}" for f in families()}


def _family_of(module: str) -> str | None:
    return next((f for f in FAMILY_PACKAGES if _in(module, f)), None)


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _family_of(m) is None))
def test_only_the_table_reaches_a_family(name: str) -> None:
    """Outside a family's folder only the catalogue (the table the selection and the plan go through) and the
    family declaration helper import it: the compiled plan reaches a family's routines through its record."""
    reached = {m for m in NAMED[name] if _family_of(m) is not None}
    assert name == "kleidipy.kernels.catalogue" or not reached, f"{name} imports {sorted(reached)}"


def test_each_family_folder_holds_its_parts() -> None:
    found = {f.name for f in families()}
    folders = {p.name for p in (ROOT / "kernels").iterdir() if (p / "__init__.py").is_file()} - {"pack"}
    assert found == folders
    for fam in families():
        folder = ROOT / "kernels" / fam.name
        assert {"ukernels.py", "isa.py"} <= {p.name for p in folder.iterdir()}
        assert fam.from_float is not None
        assert all(k.family == fam.name for k in fam.kernels)
        assert {k.name for k in fam.kernels} == set(fam.programs), "every kernel has its instruction program"
        assert bool(fam.ggml_types) == (fam.from_ggml is not None)
        assert fam.node is not None or fam.name == "qai8dxp_qsi4cxp", "the compiled plan's routines (node.py)"


def code_lines(text: str) -> int:
    """The lines of ``text`` that hold code: not blank, not only a comment, not part of a docstring (a string
    standing alone as a statement: a module's, class's or function's docstring, or an attribute's)."""
    prose = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            prose.update(range(node.lineno, node.end_lineno + 1))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in skip:
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(code - prose)


def test_code_lines_count_code_only() -> None:
    text = '"""A module.\n\nIts docstring."""\n\nimport os  # a comment\n\n# a line of comment\n\n\n' + (
        'def f(x):\n    """f\'s docstring."""\n    return (\n        x,\n    )\n'
    )
    assert code_lines(text) == 5


def test_modules_stay_small() -> None:
    """Counts code, not prose: a docstring or comment that helps a reader costs nothing here."""
    long = {name: n for name, path in MODULES.items() if (n := code_lines(path.read_text())) > MAX_CODE_LINES}
    assert set(long) <= set(LONG_MODULES), long


def test_every_package_has_an_init_that_says_what_it_owns() -> None:
    """A folder without ``__init__.py`` is a namespace package that a regular (non-editable) install leaves out."""
    for folder in sorted(p for p in ROOT.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} has no docstring"

"""Architecture rules of the package, checked on the CPU from the source tree.

- no import cycle between modules of ``cute_kernels`` and ``layouts`` (top-level and function-local
  imports both count), nor between their packages (``cute_kernels.common``, ``.gemm``,
  ``.attention``, ``.tools``, ``layouts``); ``layouts`` never imports ``cute_kernels``;
- no library module over :data:`MAX_LINES` lines;
- no run citations in library code (measurements and their history live in ``profiles/NOTES-*.md``);
- every name in an ``__all__`` of the package, its subpackages and modules is importable;
- ``import cute_kernels`` does not pull in transformers or triton.

The import graph is read with :mod:`ast` here (no dependency outside the repository).
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("cute_kernels", "layouts")
MAX_LINES = 600


def library_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the library packages."""
    mods = {}
    for pkg in LIBRARY:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            name = ".".join(parts)
            mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


MODULES = library_modules()


def _imported(cur: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """Library modules an import statement of module ``cur`` names (the longest known prefix of each)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = cur.split(".")
            if MODULES[cur].name != "__init__.py":  # relative to the module's package
                parts = parts[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join(parts + ([base] if base else []))
        names = [base] + [f"{base}.{a.name}" for a in node.names]  # `from pkg import module` names a module
    out = set()
    for n in names:
        while n and n not in MODULES:
            n = n.rpartition(".")[0]
        if n and n != cur:
            out.add(n)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the library modules it imports anywhere in its body.  An import of an enclosing
    package (``cute_kernels.tools.cli`` -> ``cute_kernels``) is left out: Python has run that package's
    ``__init__`` before the module anyway, so it adds no ordering constraint."""
    graph = {}
    for mod, path in MODULES.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps |= _imported(mod, node)
        graph[mod] = {d for d in deps if not mod.startswith(d + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def package_of(mod: str) -> str:
    """``cute_kernels.gemm.plan`` -> ``cute_kernels.gemm``; a module directly in ``cute_kernels``
    (``__init__``, ``__main__``) is its own unit; all of ``layouts`` is one."""
    parts = mod.split(".")
    if parts[0] == "layouts":
        return "layouts"
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return mod


def test_cycle_finder_finds_cycles():
    """The checker itself: a planted cycle and a self-contained chain."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    graph = {"p": set(), "p.x": {"p.y"}, "p.y": set()}
    assert cycles(graph) == []


def test_import_graph_sees_the_package():
    graph = import_graph()
    assert {"cute_kernels", "cute_kernels.common.jit", "layouts.tiles"} <= set(graph)
    assert "cute_kernels.common.jit" in graph["cute_kernels.tools.cli"] | graph["cute_kernels.tools.inspect"]
    assert "layouts.tiles" in graph["layouts.explore"]


def test_no_module_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_package_import_cycle():
    pkg_graph: dict[str, set[str]] = {}
    for mod, deps in import_graph().items():
        src = package_of(mod)
        pkg_graph.setdefault(src, set()).update(package_of(d) for d in deps if package_of(d) != src)
    found = cycles(pkg_graph)
    assert not found, "import cycles between packages:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_layouts_does_not_import_cute_kernels():
    """One way only: cute_kernels builds on layouts, layouts describes tiles without the package."""
    bad = {m: sorted(d for d in deps if d.split(".")[0] == "cute_kernels")
           for m, deps in import_graph().items() if m.split(".")[0] == "layouts"}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"layouts modules importing cute_kernels: {bad}"


def test_common_does_not_import_kernel_families():
    """common/ holds the blocks every kernel is built from: it imports no kernel family or tool."""
    bad = {m: sorted(d for d in deps if package_of(d) in ("cute_kernels.gemm", "cute_kernels.attention",
                                                           "cute_kernels.tools"))
           for m, deps in import_graph().items() if package_of(m) == "cute_kernels.common"}
    bad = {m: d for m, d in bad.items() if d}
    assert not bad, f"common modules importing kernel families or tools: {bad}"


def test_no_module_over_max_lines():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in MODULES.values()}
    big = {p: n for p, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not big, f"library modules over {MAX_LINES} lines: {big}"


#: A figure's provenance ("session 4 run 2", "s9run3", "results/gemm-2026-11-30-...md", a date):
#: measurements and their history belong in profiles/NOTES-*.md, not in library comments.
RUN_CITATION = re.compile(
    r"\bsessions? \d|\bruns? \d|\bs\d+ ?run\b|\bs\d+run\d|results/[\w.-]*20\d\d-|\b20\d\d-[01]\d-[0-3]\d\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("text", ["session 4 run 2", "(run 3)", "Sessions 5-6", "s9run3", "s5 run 1",
                                  "results/gemm-ncu-2026-11-30-s5.md", "on 2026-11-29"])
def test_run_citation_pattern_matches(text):
    assert RUN_CITATION.search(text)


@pytest.mark.parametrize("text", ["runs the kernel", "first run", "one wave of units", "run_id 3",
                                  "sm_90a", "2 CTAs per SM", "see profiles/NOTES-gemm.md"])
def test_run_citation_pattern_spares_prose(text):
    assert not RUN_CITATION.search(text)


def test_no_run_citations_in_library_code():
    hits = []
    for path in MODULES.values():
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if RUN_CITATION.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not hits, (f"{len(hits)} run citations in library code (move them to profiles/NOTES-*.md):\n"
                      + "\n".join(hits))


def _public_names(modname: str) -> list[str]:
    return list(getattr(importlib.import_module(modname), "__all__", []))


@pytest.mark.parametrize("modname", sorted(MODULES))
def test_all_names_importable(modname):
    """Every name a module or package lists in ``__all__`` exists there (``from X import *`` works)."""
    if modname.endswith("__main__"):
        pytest.skip("the entry point has no public names")
    mod = importlib.import_module(modname)
    names = getattr(mod, "__all__", None)
    if names is None:
        return
    assert len(set(names)) == len(names), f"{modname}.__all__ lists a name twice: {names}"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{modname}.__all__ names that do not exist: {missing}"


def test_package_public_surface():
    """The top-level API and each subpackage declare ``__all__``, and star-imports give those names."""
    for modname in ("cute_kernels", "cute_kernels.gemm", "cute_kernels.attention", "layouts"):
        names = _public_names(modname)
        assert names, f"{modname} has no __all__"
        ns: dict = {}
        exec(f"from {modname} import *", ns)
        assert set(names) <= set(ns), (modname, set(names) - set(ns))
    import cute_kernels

    assert {"gemm", "decode_attn", "merge_states", "merge_state", "warmup"} <= set(cute_kernels.__all__)


def test_import_does_not_pull_heavy_optional_packages():
    """``import cute_kernels`` loads torch and the DSL, not transformers or triton (optional peers)."""
    code = ("import sys, cute_kernels; "
            "print(','.join(m for m in ('transformers', 'triton') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "", f"import cute_kernels imported: {r.stdout.strip()}"


def test_tests_have_one_conftest():
    """Tests import helpers with ``from conftest import ...``; a second ``conftest.py`` under tests/ (no
    packages there) is imported under the same module name and replaces the first in ``sys.modules``,
    so those imports fail depending on which tests a worker collected."""
    found = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("conftest.py"))
    assert found == ["tests/conftest.py"], found


def test_quick_compile_tier_names_collected_cases(request):
    """Every case QUICK_COMPILES keeps in the quick tier is a collected case of its test (a renamed
    case would otherwise leave its test with no case in the quick tier, silently), and every listed
    test has cases beyond it (else the entry says nothing)."""
    from conftest import QUICK_COMPILES

    def holds(ids):
        return all(key in ids and quick <= ids[key] and ids[key] - quick for key, quick in QUICK_COMPILES.items())

    ids: dict[str, set] = {}
    for item in request.session.items:  # a whole run collected them all: no second collection needed
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if key in QUICK_COMPILES and hasattr(item, "callspec"):
            ids.setdefault(key, set()).add(item.callspec.id)
    if holds(ids):
        return
    # a partial run (or a real mistake): collect the files in a subprocess, and name what is wrong
    files = sorted({key.split("::")[0] for key in QUICK_COMPILES})
    paths = [str(p) for name in files for p in (ROOT / "tests").rglob(name)]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = {}
    for line in out.stdout.splitlines():
        m = re.match(r"^\S*?([^/\s]+\.py)::(\w+)\[(.*)\]$", line.strip())
        if m:
            ids.setdefault(f"{m.group(1)}::{m.group(2)}", set()).add(m.group(3))
    for key, quick in QUICK_COMPILES.items():
        assert key in ids, f"{key}: no parametrized test of that name was collected"
        assert quick <= ids[key], (key, sorted(quick - ids[key]), sorted(ids[key]))
        assert ids[key] - quick, f"{key}: every case is in the quick tier"

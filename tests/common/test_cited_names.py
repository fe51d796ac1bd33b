"""Every dotted ``cute_kernels.*`` name the README, profiles/README.md and the package's own texts (CLI
help, docstrings) cite resolves as a reader would use it: attribute by attribute from ``import
cute_kernels``, a module imported where Python's dotted import would import one.  (``cute_kernels.gemm``
is the function; the gemm subpackage's names are its attributes.)"""

import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bcute_kernels(?:\.[A-Za-z_]\w*)+")


def cited() -> dict[str, str]:
    """name -> the first file citing it."""
    files = [ROOT / "README.md", ROOT / "profiles" / "README.md", *sorted((ROOT / "cute_kernels").rglob("*.py"))]
    names: dict[str, str] = {}
    for f in files:
        if f.exists():
            for m in NAME.finditer(f.read_text()):
                names.setdefault(m.group(0), str(f.relative_to(ROOT)))
    return names


def resolve(dotted: str):
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    path = parts[0]
    for part in parts[1:]:
        path = f"{path}.{part}"
        if not hasattr(obj, part):
            try:
                importlib.import_module(path)  # what `import a.b.c` would do
            except ModuleNotFoundError:
                pass
        obj = getattr(obj, part)
    return obj


NAMES = cited()


def test_the_scan_finds_the_documented_names():
    assert {"cute_kernels.gemm.explain", "cute_kernels.gemm.plan.config_buckets",
            "cute_kernels.gemm.warmup_gemm"} <= set(NAMES)


@pytest.mark.parametrize("dotted", sorted(NAMES))
def test_cited_name_resolves(dotted):
    try:
        resolve(dotted)
    except AttributeError as e:
        pytest.fail(f"{dotted} (cited in {NAMES[dotted]}) does not resolve: {e}")

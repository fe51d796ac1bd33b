"""profiles/ stays navigable: every script there is described in its README, and the device session
script names only files that exist (a removed probe or a moved test file breaks a device call)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "profiles"


def test_readme_describes_every_script():
    readme = (PROFILES / "README.md").read_text()
    table = readme.split("## Probes removed", 1)[0]  # the files that are here, not the removed ones
    missing = [p.name for p in sorted(PROFILES.glob("*.py")) + sorted(PROFILES.glob("*.sh"))
               if f"`{p.name}`" not in table]
    assert not missing, f"profiles/README.md does not describe: {missing}"


def test_removed_probes_are_gone():
    readme = (PROFILES / "README.md").read_text()
    removed = re.findall(r"^\| `(\w+\.py)` \|", readme.split("## Probes removed", 1)[1], re.MULTILINE)
    assert removed, "the README lists the removed probes"
    assert not [n for n in removed if (PROFILES / n).exists()]


def test_gpu_session_names_existing_files():
    script = (PROFILES / "gpu_session.sh").read_text()
    paths = set(re.findall(r"\b((?:profiles|tests)/[\w/.-]*\w)", script))
    assert any(p.startswith("tests") for p in paths) and any(p.startswith("profiles") for p in paths)
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"profiles/gpu_session.sh names files that do not exist: {missing}"


def test_scripts_import_only_existing_siblings():
    """A script importing a sibling (``from timing import bench_clean``) needs that sibling here."""
    import ast

    here = {p.stem for p in PROFILES.glob("*.py")}
    stdlib_or_pkg = {"cute_kernels", "layouts", "torch", "triton", "cutlass", "quack", "flash_attn", "numpy"}
    bad = []
    for path in sorted(PROFILES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module.split(".")[0]]
            for n in names:
                looks_local = n.startswith(("bench_", "ab_", "gemm_", "l2_", "read_", "sanitize", "timing"))
                if looks_local and n not in here and n not in stdlib_or_pkg:
                    bad.append(f"{path.name}:{node.lineno} imports {n}")
    assert not bad, f"profiles scripts import siblings that do not exist: {bad}"

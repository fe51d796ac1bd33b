"""The CLI and the CPU compile report: every kernel family builds for sm_90a without spills."""

import os
import subprocess
import sys

from cute_kernels.tools import report


def test_compile_report_every_kernel():
    rows = report.compile_report(print_fn=lambda *_: None)
    labels = {r["label"] for r in rows}
    assert any(l.startswith("gemm") for l in labels)
    assert any(l.startswith("decode_attn") for l in labels)
    assert any(l.startswith("merge_states") for l in labels)
    for r in rows:
        assert r["spills"] == 0 and r["stack"] == 0, r
        if r["label"].startswith("gemm"):  # tensor cores, fed by TMA or (cp.async mainloop) LDGSTS
            assert r.get("HGMMA", 0) > 0, r
            assert r.get("UTMALDG", 0) > 0 or ("cp.async" in r["label"] and r.get("LDGSTS", 0) > 0), r


def test_cli_layouts_text():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "layouts", "gemm", "--what", "mma-c"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "thread" in out.stdout.lower() or "t0" in out.stdout.lower()


def test_cli_demo_cpu(tmp_path):
    """The CPU demo compiles everything and writes the layout pictures."""
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "demo", "--cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    files = sorted(os.listdir(tmp_path))
    assert any(f.endswith(".svg") for f in files) and any(f.endswith(".png") for f in files), files


def test_cli_unknown_kernel():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "layouts", "nope"], capture_output=True, text=True)
    assert out.returncode != 0 and "known" in (out.stderr + out.stdout)


def test_cli_plan():
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "plan", "gemm", "4096", "4096", "4096"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tile_mnk       (128, 256, 64)" in out.stdout and "raster         (8, 'N')" in out.stdout
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "plan", "decode", "1", "32", "8", "32768"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "num_splits" in out.stdout and "kv_bytes       134217728" in out.stdout

"""The ``cute-kernels`` command on the CPU: every subcommand's success path and its one-line errors.

Most tests call :func:`cute_kernels.tools.cli.main` in this process (one import of torch and the DSL);
one runs the installed entry point (``python -m cute_kernels``) to see what a user's shell sees.
The full ``report`` / ``demo --cpu`` compile every kernel (about a minute each on two cores) and are
marked slow; the compile report itself is checked once, structurally, here.
"""

import os
import subprocess
import sys

import pytest

from cute_kernels.tools import cli, report

SUBCOMMANDS = [
    ["demo"], ["report"], ["plan"], ["plan", "gemm"], ["plan", "decode"], ["warmup"], ["warmup", "gemm"],
    ["warmup", "decode"], ["warmup", "merge"], ["tune"], ["layouts"],
]


def run_main(capsys, argv):
    """(exit status, stdout, stderr) of ``cute-kernels ARGV`` run in this process."""
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_one_line_error(rc, err, *words):
    assert rc == 2, (rc, err)
    assert err.count("\n") == 1 and ": error: " in err and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.matrix  # every representative configuration, ~45 s: each family compiles in the quick tier's tests
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


# ---- help ----------------------------------------------------------------------------------------
def test_help_lists_every_subcommand(capsys):
    rc, out, _ = run_main(capsys, ["--help"])
    assert rc == 0
    for name in ("demo", "report", "plan", "warmup", "tune", "layouts"):
        assert f"\n    {name}" in out, (name, out)


@pytest.mark.parametrize("argv", SUBCOMMANDS, ids=lambda a: "-".join(a))
def test_help_of_each_subcommand(capsys, argv):
    """Each subcommand documents its arguments: ``--help`` exits 0 and every argument has a line."""
    rc, out, _ = run_main(capsys, [*argv, "--help"])
    assert rc == 0 and out.startswith("usage: cute-kernels " + " ".join(argv)), out
    if argv in (["plan", "gemm"], ["warmup", "gemm"]):
        for word in ("m ", "n ", "k ", "--batch", "--dtype", "--out-dtype", "--a-major", "--b-major", "--with-c"):
            assert word in out, word
    if argv in (["plan", "decode"], ["warmup", "decode"]):
        for word in ("batch", "heads_q", "heads_kv", "capacity", "--head-dim", "--sq", "--page-size", "--num-splits"):
            assert word in out, word


# ---- plan ----------------------------------------------------------------------------------------
def test_plan_gemm(capsys):
    rc, out, err = run_main(capsys, ["plan", "gemm", "4096", "4096", "4096"])
    assert rc == 0, err
    assert out.startswith("gemm 4096x4096x4096 bfloat16, a row-major, b row-major:")
    assert "tile_mnk       (128, 256, 64)" in out and "raster         (8, 'N')" in out


def test_plan_decode(capsys):
    rc, out, err = run_main(capsys, ["plan", "decode", "1", "32", "8", "32768"])
    assert rc == 0, err
    assert "num_splits" in out and "kv_bytes       134217728" in out
    for hd in ("64", "256"):
        rc, out, err = run_main(capsys, ["plan", "decode", "2", "8", "8", "1000", "--head-dim", hd, "--sq", "16",
                                         "--page-size", "16", "--dtype", "float16"])
        assert rc == 0 and f"D{hd} Sq16 pages of 16" in out, err


@pytest.mark.parametrize("head_dim, sq", [(d, 1) for d in (32, 63, 64, 96, 128, 256, 512)]
                         + [(128, s) for s in (0, 1, cli.DECODE_MAX_SQ, cli.DECODE_MAX_SQ + 1)])
def test_plan_decode_limits_match_the_library(capsys, head_dim, sq):
    """``plan decode`` accepts exactly the head dims and query lengths ``decode_attn`` accepts (its CPU
    path validates the same way), so the CLI's limits cannot drift from the kernel's."""
    import torch

    from cute_kernels.attention import decode_attn

    q = torch.randn(1, max(sq, 0), 2, head_dim, dtype=torch.bfloat16)
    k = torch.randn(1, 8, 2, head_dim, dtype=torch.bfloat16)
    try:
        decode_attn(q, k, k.clone(), cache_seqlens=torch.tensor([8], dtype=torch.int32))
        library_ok = True
    except ValueError:
        library_ok = False
    rc, _, err = run_main(capsys, ["plan", "decode", "1", "2", "2", "8", "--head-dim", str(head_dim), "--sq", str(sq)])
    assert (rc == 0) == library_ok, (head_dim, sq, library_ok, err)


@pytest.mark.parametrize("argv, words", [
    (["plan", "decode", "1", "32", "8", "1024", "--head-dim", "63"], ["--head-dim", "invalid choice: 63"]),
    (["plan", "decode", "1", "32", "8", "1024", "--sq", "17"], ["--sq", "1..16"]),
    (["plan", "decode", "1", "32", "8", "1024", "--sq", "0"], ["--sq"]),
    (["plan", "decode", "1", "32", "7", "1024"], ["heads_q (32) must be a multiple of heads_kv (7)"]),
    (["plan", "decode", "0", "32", "8", "1024"], ["batch", "in 1..2147483647"]),
    (["plan", "decode", "1", "32", "8", "1024", "--page-size", "4096"], ["--page-size"]),
    (["plan", "decode", "1", "32", "8", "1024", "--num-splits", "0"], ["--num-splits"]),
    (["plan", "decode", "1", "32", "8"], ["capacity"]),
    (["plan", "gemm", "-5", "3", "3"], ["argument m", "in 0..2147483647"]),
    (["plan", "gemm", "1", "2", "x"], ["argument k", "'x'"]),
    (["plan", "gemm", "64", "64", "64", "--dtype", "float32"], ["--dtype", "invalid choice"]),
    (["plan", "gemm", "64", "64", "64", "--a-major", "k"], ["--a-major"]),
    (["plan", "conv", "1"], ["invalid choice: 'conv'"]),
    (["plan"], ["KERNEL"]),
    (["warmup"], ["KERNEL"]),
    (["warmup", "gemm", "8", "8"], ["k"]),
    (["warmup", "decode", "1", "32", "8", "1024", "--head-dim", "96"], ["--head-dim"]),
    (["tune", "conv", "1", "2", "3"], ["invalid choice: 'conv'"]),
    (["tune", "gemm", "0", "2", "3"], ["argument m"]),
    (["nope"], ["invalid choice: 'nope'"]),
    ([], ["COMMAND"]),
])
def test_bad_argument_one_line(capsys, argv, words):
    rc, out, err = run_main(capsys, argv)
    assert_one_line_error(rc, err, *words)
    assert out == ""


def test_tune_without_gpu_one_line(capsys):
    from cute_kernels.common.arch import has_gpu

    if has_gpu():
        pytest.skip("CPU behaviour (on a GPU, tune runs)")
    rc, _, err = run_main(capsys, ["tune", "gemm", "128", "128", "128"])
    assert_one_line_error(rc, err, "needs a CUDA GPU")


@pytest.mark.gpu
def test_tune_gemm(capsys):
    """On a GPU: ``tune gemm`` times the candidates for one shape and prints the winner."""
    rc, out, err = run_main(capsys, ["tune", "gemm", "256", "512", "256"])
    assert rc == 0, err
    assert "best for 256x512x256 bfloat16: " in out, out


def test_entry_point_bad_argument_is_one_line():
    """What a shell sees: ``python -m cute_kernels plan decode ... --head-dim 63`` -> one line, status 2."""
    r = subprocess.run([sys.executable, "-m", "cute_kernels", "plan", "decode", "1", "32", "8", "1024",
                        "--head-dim", "63"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if "Warning" not in l and "warnings.warn" not in l]
    assert lines == ["cute-kernels plan decode: error: argument --head-dim: invalid choice: 63 (choose from 64, "
                     "128, 256) (see cute-kernels plan decode --help)"], r.stderr


# ---- bounds --------------------------------------------------------------------------------------
H200_GIB = "140.4 GiB"


@pytest.mark.parametrize("argv, words", [
    (["plan", "gemm", "4611686018427387904", "8", "8"], ["argument m", "in 0..2147483647"]),
    (["plan", "gemm", "99999999999", "99999999999", "99999999999"], ["argument m", "in 0..2147483647"]),
    (["plan", "gemm", "8", "8", "2147483648"], ["argument k", "in 0..2147483647"]),
    (["plan", "gemm", "200000", "200000", "200000"], ["223.5 GiB", H200_GIB]),
    (["plan", "gemm", "100000", "100000", "8", "--batch", "8"], ["batch 8", H200_GIB]),
    (["plan", "gemm", "8", "8", "8", "--batch", "2147483648"], ["argument --batch", "in 1..2147483647"]),
    (["plan", "decode", "1", "32", "8", "4611686018427387904"], ["argument capacity", "in 1..2147483647"]),
    (["plan", "decode", "1000", "32", "8", "10000000"], ["q, K, V and the output", H200_GIB]),
    (["plan", "decode", "1", "32", "8", "1024", "--num-splits", "5000"], ["--num-splits", "in 1..1024"]),
    (["warmup", "gemm", "1000000", "8", "1000000"], ["cute-kernels warmup gemm: error:", "1,862.7 GiB", H200_GIB]),
    (["warmup", "decode", "1", "2147483647", "1", "8"], ["q, K, V and the output", H200_GIB]),
    (["warmup", "merge", "--head-dim", "100000", "--dtype", "float32"], ["--head-dim", "invalid choice: 100000"]),
    (["tune", "gemm", "300000", "300000", "300000"], ["cute-kernels tune: error:", H200_GIB]),
    (["layouts", "gemm", "--what", "raster", "--plan", "4611686018427387904,8,8"], ["--plan", "1..2147483647"]),
    (["layouts", "gemm", "--what", "raster", "--plan", "300000,300000,8"], ["--plan", H200_GIB]),
    (["layouts", "gemm", "--what", "raster", "--plan", "2147483647,8,8"], ["16777216 work tiles", "at most 65536"]),
    (["layouts", "gemm", "--what", "raster", "--problem", "99999999999,99999999999"], ["--problem", "1..2147483647"]),
    (["layouts", "gemm", "--what", "raster", "--problem", "2147483647,2147483647"], ["work tiles", "at most 65536"]),
    # 256 x 256 tiles are 65536, but a swizzle of 3 pads them to 86 strips of 3: 66048
    (["layouts", "gemm", "--what", "raster", "--problem", "32768,32768", "--tile", "128,128,64", "--swizzle", "3"],
     ["66048 work tiles"]),
    (["layouts", "gemm", "--what", "raster", "--num-ctas", "100000"], ["--num-ctas", "1..1024"]),
    (["layouts", "gemm", "--what", "raster", "--swizzle", "4611686018427387904"], ["work tiles with swizzle"]),
    (["layouts", "gemm", "--tile", "128,100000,64"], ["--tile", "1..256"]),
    (["layouts", "gemm", "--cluster", "1,64"], ["--cluster", "1..16"]),
    (["layouts", "gemm", "--what", "layout", "--layout", "(100000,100000):(1,100000)"], ["10000000000 elements"]),
    (["layouts", "gemm", "--what", "layout", "--layout", "(4,0)"], ["positive integers"]),
])
def test_sizes_are_bounded_in_one_line(capsys, argv, words):
    """Every size is bounded where it is parsed, before any planning, allocation or compile: one line
    naming the argument or the bound, status 2, nothing on stdout."""
    import time

    t0 = time.perf_counter()
    rc, out, err = run_main(capsys, argv)
    assert_one_line_error(rc, err, *words)
    assert out == "" and time.perf_counter() - t0 < 30


@pytest.mark.parametrize("argv", [
    ["plan", "gemm", "2147483647", "8", "8"], ["plan", "gemm", "8", "8", "2147483647", "--a-major", "col"],
    ["plan", "decode", "1", "1", "1", "500000000", "--head-dim", "64"],
    ["layouts", "gemm", "--what", "raster", "--problem", "32768,32768", "--tile", "128,128,64", "--swizzle", "4"],
])
def test_sizes_at_the_bounds_run(capsys, argv):
    """The largest sizes the bounds let through plan (and draw) without an error."""
    rc, out, err = run_main(capsys, argv)
    assert rc in (0, None) and out and "error" not in err, err[-2000:]


@pytest.mark.parametrize("argv", [
    ["layouts", "gemm", "--what", "raster", "--problem", "99999999999,99999999999", "--num-ctas", "132"],
    ["warmup", "merge", "--head-dim", "100000", "--dtype", "float32"],
])
def test_runaway_sizes_are_refused_in_a_shell(argv):
    """What a shell sees for the sizes that used to take all the memory or compile for minutes: a
    process allowed 4 GB more data memory than it starts with and 150 s answers in one line, status 2."""
    code = ("import re, resource, sys\n"
            "from cute_kernels.tools import cli, layouts_cli\n"  # imported before the limit
            "data = int(re.search(r'VmData:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)) * 1024\n"
            "resource.setrlimit(resource.RLIMIT_DATA, (data + 4 * 2**30,) * 2)\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=150)
    lines = [l for l in r.stderr.splitlines() if "Warning" not in l and "warnings.warn" not in l]
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and ": error: " in lines[0], r.stderr[-2000:]


def test_bounds_are_in_the_help(capsys):
    for argv in (["plan", "gemm"], ["warmup", "decode"], ["tune"], ["layouts"]):
        rc, out, _ = run_main(capsys, [*argv, "--help"])
        text = " ".join(out.split())
        assert rc == 0 and "2^31 - 1" in text and "H200's memory" in text, (argv, out)
    rc, out, _ = run_main(capsys, ["warmup", "merge", "--help"])
    assert "{64,96,128,256}" in out


def test_version(capsys):
    from importlib import metadata

    rc, out, _ = run_main(capsys, ["--version"])
    assert rc == 0 and out == f"cute-kernels {metadata.version('cute-kernels')}\n"


# ---- warmup --------------------------------------------------------------------------------------
def test_warmup_gemm_compiles_what_plan_shows(capsys):
    """``warmup gemm`` compiles (or loads) the kernels ``plan gemm`` lists; a second run is a cache hit."""
    from cute_kernels.common import jit

    rc, out, err = run_main(capsys, ["warmup", "gemm", "100", "136", "64"])
    assert rc == 0, err
    assert out.startswith("gemm 100x136x64 bfloat16, a row-major, b row-major: gemm_sm90"), out
    assert "compiled" in out and "loaded from disk" in out
    before = dict(jit.stats)
    rc, out, err = run_main(capsys, ["warmup", "gemm", "100", "136", "64"])
    assert rc == 0 and jit.stats["compiles"] == before["compiles"], (out, err)
    assert "compiled 0, loaded from disk 0" in out  # in memory already


def test_warmup_decode(capsys):
    rc, out, err = run_main(capsys, ["warmup", "decode", "1", "8", "8", "256", "--head-dim", "64"])
    assert rc == 0, err
    assert out.startswith("decode_attn b1 hq8 hkv8 capacity 256 D64 Sq1 contiguous: decode_attn"), out
    assert "compiled" in out


def test_warmup_merge(capsys):
    rc, out, err = run_main(capsys, ["warmup", "merge", "--head-dim", "64", "--dtype", "bfloat16"])
    assert rc == 0, err
    assert out.startswith("merge_states bfloat16 D64: merge_states"), out
    rc, _, err = run_main(capsys, ["warmup", "merge", "--head-dim", "7", "--dtype", "bfloat16"])
    assert_one_line_error(rc, err, "--head-dim", "invalid choice: 7", "64, 96, 128, 256")


def test_warmup_host_memory_is_one_line(capsys, monkeypatch):
    """The library's warm-up allocates the GEMM's operands (unread); a host that cannot is one line."""
    from cute_kernels.common import jit

    def refuse(todo):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 120000000000 bytes")

    monkeypatch.setattr(jit, "warmup", refuse)
    rc, out, err = run_main(capsys, ["warmup", "gemm", "200000", "8", "300000"])
    assert_one_line_error(rc, err, "cannot allocate the operands", "120000000000 bytes")
    assert out == ""


# ---- layouts -------------------------------------------------------------------------------------
def test_layouts_text(capsys):
    rc, out, err = run_main(capsys, ["layouts", "gemm", "--what", "mma-c"])
    assert rc == 0, err
    assert out.startswith("wgmma C atom 64x")


def test_layouts_bad_argument_one_line(capsys):
    rc, _, err = run_main(capsys, ["layouts", "nope"])
    assert_one_line_error(rc, err, "cute-kernels layouts: error:", "invalid choice: 'nope'")


@pytest.mark.parametrize("out, fmt, words", [
    ("x.jpg", None, ["--out", "x.jpg", ".txt, .svg, .png"]),
    ("x", None, ["--out"]),
    ("x.svg", "png", ["--format png does not match"]),
    ("x.png", "text", ["--format text does not match"]),
])
def test_layouts_refuses_formats_it_does_not_write(capsys, tmp_path, out, fmt, words):
    path = tmp_path / out
    rc, stdout, err = run_main(capsys, ["layouts", "gemm", "--out", str(path), *(["--format", fmt] if fmt else [])])
    assert_one_line_error(rc, err, *words)
    assert not path.exists() and stdout == ""


@pytest.mark.parametrize("name, fmt", [("x.txt", "text"), ("x.SVG", "svg"), ("x.png", "png")])
def test_layouts_writes_what_the_extension_says(capsys, tmp_path, name, fmt):
    """The format written is the one named; the picture is a small one (an 8 x 8 tile raster): drawing
    the default 64 x 128 accumulator fragment takes seconds (its PNG ~20 s on two cores) and is
    test_layouts_text's (text) and tests/layouts' (SVG, PNG size)."""
    path = tmp_path / name
    rc, _, err = run_main(capsys, ["layouts", "gemm", "--what", "raster", "--problem", "1024,1024", "--out", str(path),
                                   "--format", fmt])
    assert rc == 0 and f"({fmt})" in err
    head = path.read_bytes()[:8]
    assert head.startswith(b"\x89PNG") if fmt == "png" else head.startswith(b"<svg") or head.startswith(b"<?xml") \
        if fmt == "svg" else not head.startswith((b"<", b"\x89"))


# ---- demo / report -------------------------------------------------------------------------------
@pytest.mark.matrix  # ~25 s on 2 cores: the pictures' layouts are evaluated element by element in the DSL
def test_demo_pictures(tmp_path):
    """The CPU demo's pictures (the cheap half of ``demo --cpu``): SVGs and PNGs of the GEMM's layouts."""
    paths = cli._demo_pictures(str(tmp_path))
    files = sorted(os.listdir(tmp_path))
    assert len(paths) == len(files) == 5, files
    assert any(f.endswith(".svg") for f in files) and any(f.endswith(".png") for f in files), files


@pytest.mark.slow
def test_demo_cpu(tmp_path):
    """``cute-kernels demo --cpu``: compiles every kernel, prints the report, writes the pictures."""
    out = subprocess.run([sys.executable, "-m", "cute_kernels", "demo", "--cpu", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "regs/thread" in out.stdout and "Layout pictures:" in out.stdout
    assert len(os.listdir(tmp_path)) == 5


@pytest.mark.slow
def test_report_command(capsys):
    rc, out, err = run_main(capsys, ["report"])
    assert rc == 0, err
    assert out.count("regs/thread, stack 0 B, local-memory ops 0") >= 10, out

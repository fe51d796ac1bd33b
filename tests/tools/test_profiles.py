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


# ---------------------------------------------------------------------------- stress.py / sweep.py (issue 19)
import itertools  # noqa: E402
import importlib  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from conftest import RUN_MATRIX  # noqa: E402


def _script(name):
    """profiles/<name>.py imported by path (its directory on sys.path, as when it runs as a script)."""
    if str(PROFILES) not in sys.path:
        sys.path.insert(0, str(PROFILES))
    return importlib.import_module(name)


def _run(*args, timeout=120):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", ["stress.py", "sweep.py"])
def test_scripts_parse_help(name):
    r = _run(str(PROFILES / name), "--help")
    assert r.returncode == 0, r.stderr
    assert "--ops" in r.stdout and "--list" in r.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
@pytest.mark.parametrize("name", ["stress.py", "sweep.py"])
def test_scripts_skip_without_cuda(name):
    r = _run(str(PROFILES / name))
    assert r.returncode == 0, r.stderr
    assert "no CUDA" in r.stdout and "skipped" in r.stdout


def test_sweep_rejects_unknown_op():
    sw = _script("sweep")
    assert sw.parse_ops("gemm,decode,merge,flash") == list(sw.OPS)
    with pytest.raises(Exception, match="unknown op"):
        sw.parse_ops("gemm,conv")


@pytest.fixture(scope="module")
def sweep_cases():
    """The default sweep's cases per op (seed 19) and their distinct kernel configurations."""
    sw = _script("sweep")
    return {op: sw.select_cases(op, sw.DEFAULT_N, sw.DEFAULT_SEED, sw.BUDGET[op]) for op in sw.OPS}


def test_sweep_shapes_deterministic_for_a_seed(sweep_cases):
    sw = _script("sweep")
    for op in sw.OPS:
        again, _ = sw.select_cases(op, sw.DEFAULT_N, sw.DEFAULT_SEED, sw.BUDGET[op])
        assert again == sweep_cases[op][0], op
        other, _ = sw.select_cases(op, 20, sw.DEFAULT_SEED + 1, sw.BUDGET[op])
        assert [sw.case_name(c) for c in other] != [sw.case_name(c) for c in sweep_cases[op][0][:20]], op
    # the candidate stream alone (no planning) is a pure function of (op, seed)
    first = [next(sw.candidates("gemm", 5)) for _ in range(2)]
    assert first[0] == first[1]


def _sizes(op, c):
    if op == "gemm":
        return [c["m"], c["n"], c["k"]]
    if op == "decode_attn":
        return c["lens"]
    if op == "merge_states":
        return [c["p"], *c["rows"]]
    return [c["sq"], c["sk"]]


TILES = {"gemm": (64, 128, 256), "decode_attn": (32, 64, 128), "merge_states": (4, 32, 128), "flash_attn": (64, 128, 192)}


def test_sweep_has_100_shapes_per_op_with_primes_and_tile_edges(sweep_cases):
    sw = _script("sweep")
    for op, (cases, keys) in sweep_cases.items():
        assert len(cases) >= 100, op
        assert len(keys) <= sw.BUDGET[op], op
        sizes = [s for c in cases for s in _sizes(op, c)]
        primes = [s for s in sizes if sw.is_prime(s) and s > 7]
        edges = [s for s in sizes if sw.near_tile(s, TILES[op])]
        assert len(primes) >= 10 and len(edges) >= 10, (op, len(primes), len(edges))
        assert len(set(map(sw.case_name, cases))) == len(cases), f"{op}: repeated cases"
    g = sweep_cases["gemm"][0]
    assert max(max(c["m"], c["n"], c["k"]) for c in g) <= 4096
    assert any(s % 64 in (1, 63) for c in g for s in (c["m"], c["n"])) and any(c["k"] % 64 in (1, 63) for c in g)
    kinds = {c["plan"].split()[0] for c in g}
    assert {"persistent", "persistent/cpasync", "swapped"} <= kinds, kinds
    assert any(c["batch"] for c in g) and any(c["beta"] for c in g) and any(c["out_dtype"] == "float32" for c in g)
    d = sweep_cases["decode_attn"][0]
    assert any(c["page"] for c in d) and any(not c["page"] for c in d) and any(c["sq"] > 1 for c in d)
    assert any(0 in c["lens"] for c in d) and any(c["hq"] > c["hkv"] for c in d)
    f = sweep_cases["flash_attn"][0]
    assert {(c["d"], c["causal"]) for c in f} == {(d, k) for d in (64, 96, 128, 256) for k in (False, True)}
    # the cold-cache compile bill: every configuration at ~5 s on 12 processes stays well inside 8 minutes
    assert sum(len(k) for _, k in sweep_cases.values()) <= 100


def test_quick_sweep_is_small():
    sw = _script("sweep")
    for op in sw.OPS:
        cases, keys = sw.select_cases(op, sw.QUICK_N, sw.DEFAULT_SEED, sw.QUICK_BUDGET[op])
        assert len(cases) == sw.QUICK_N and len(keys) <= sw.QUICK_BUDGET[op]


def test_checker_fails_on_zeroed_tail_row():
    sw = _script("sweep")
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 96, generator=g).bfloat16(), torch.randn(96, 136, generator=g).bfloat16()
    ref, mag, scale = sw.gemm_ref(a, b)
    good = (a.float() @ b.float()).bfloat16()  # what a correct kernel writes: fp32 sums, one rounding
    tol = sw.TOL["gemm"]["bfloat16"]
    kw = dict(rtol=tol[0], atol=tol[1], row_tol=tol[2], mag=mag, scale=scale, rows=((-1, -2), (-2, -1)))
    r = sw.compare(good, ref, **kw)
    assert r["ok"] and r["err"] < 1, r
    for bad, where in ((lambda o: o[-1].zero_(), "row"), (lambda o: o[:, -1].zero_(), "column"),
                       (lambda o: o[-1].copy_(o[-2]), "stale row")):
        out = good.clone()
        bad(out)
        r = sw.compare(out, ref, **kw)
        assert not r["ok"] and r["tail"] > 1, (where, r)
    out = good.clone()
    out[7, 3] = float("nan")
    r = sw.compare(out, ref, **kw)
    assert not r["ok"] and r["nonfinite"] == 1
    out = good.clone()
    out[150] = 0  # a row inside fails too (not a tail)
    r = sw.compare(out, ref, **kw)
    assert not r["ok"] and r["tail"] < 1


def test_checker_row_check_catches_what_the_elementwise_bound_misses():
    """Where outputs are small next to their elementwise bound (attention over very long sequences:
    |O| ~ 1/sqrt(L) against P @ |V| ~ 1), a zeroed row passes elementwise; the per-row check fails it."""
    sw = _script("sweep")
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 9, 4, 64, generator=g, dtype=torch.float64) * 2e-3  # (B, Sq, H, D)
    scale = torch.ones_like(ref)  # the bound P @ |V|
    good = ref.bfloat16()
    kw = dict(rtol=2 ** -7, atol=2 ** -7, row_tol=0.03, scale=scale, rows=((-1, 1),))
    assert sw.compare(good, ref, **kw)["ok"]
    out = good.clone()
    out[1, -1, 2] = 0  # the last query row of one head
    r = sw.compare(out, ref, **kw)
    assert r["elem"] <= 1, "elementwise alone passes it"
    assert not r["ok"] and r["row"] > 1 and r["tail"] > 1


def test_attention_reference_and_lse_check():
    """attn_ref: softmax rows sum to one (o of constant V is that constant), bottom-right causal rows that
    see no key give 0 / -inf; a zeroed last query row of a real output fails; the LSE check wants the
    same -inf pattern."""
    sw = _script("sweep")
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(5, 4, 64, generator=g).bfloat16(), torch.randn(3, 2, 64, generator=g).bfloat16()
    v = torch.full((3, 2, 64), 0.5).bfloat16()
    o, o_abs, lse = sw.attn_ref(q, k, v, True, 0.125)  # Sq 5 > L 3: queries 0, 1 see no key
    assert (o[:2] == 0).all() and torch.isneginf(lse[:, :2]).all() and torch.isfinite(lse[:, 2:]).all()
    assert torch.allclose(o[2:], torch.full_like(o[2:], 0.5)) and torch.allclose(o_abs, o)
    q, k, v = (torch.randn(*s, generator=g).bfloat16() for s in ((40, 4, 64), (1000, 2, 64), (1000, 2, 64)))
    o, o_abs, lse = sw.attn_ref(q, k, v, False, 64 ** -0.5)
    tol = sw.TOL["attn"]["bfloat16"]
    kw = dict(rtol=tol[0], atol=tol[1], row_tol=tol[2], scale=o_abs, rows=((-1, 0),))
    assert sw.compare(o.bfloat16(), o, **kw)["ok"]
    out = o.bfloat16()
    out[-1, 1] = 0
    r = sw.compare(out, o, **kw)
    assert not r["ok"] and r["tail"] > 1
    assert sw.compare_lse(lse, lse.double(), 2e-3) == 0.0
    bad_lse = lse.clone()
    bad_lse[0, 0] = -math.inf
    assert sw.compare_lse(bad_lse, lse, 2e-3) == math.inf


def test_guard_sees_writes_past_a_view():
    sw = _script("sweep")
    m = sw.Mat("bfloat16", (), 5, 7, "row", ld=9)
    base = m.alloc("cpu")
    m.view(base).fill_(1.0)
    assert sw.guard_ok(base, m)
    base[7] = 0.0  # column 7 of row 0: outside the view
    assert not sw.guard_ok(base, m)
    assert "wrote 1 elements" in sw.guard_report(base, m) and "[0,7]=0" in sw.guard_report(base, m)


class _Fake:
    """CPU stand-ins for the GPU-only ops (the real decode_attn / merge_states run their CPU paths)."""

    def __init__(self, sw, bad_tail=False):
        import cute_kernels

        self.sw, self.bad_tail = sw, bad_tail
        self.decode_attn, self.merge_states = cute_kernels.decode_attn, cute_kernels.merge_states

    def gemm(self, a, b, out=None, alpha=1.0, beta=0.0, c=None):
        r = alpha * (a.float() @ b.float()) + (beta * c.float() if c is not None and beta else 0)
        out.copy_(r.to(out.dtype))
        if self.bad_tail:
            out[..., -1, :] = 0
        return out

    def flash_attn(self, q, k, v, causal=False, out=None, return_lse=False, window_size=(-1, -1),
                   cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                   block_table=None, seqused_k=None):
        window = None if tuple(window_size) == (-1, -1) else tuple(window_size)
        scale = q.shape[-1] ** -0.5
        if block_table is not None:  # paged: gather each sequence's keys from its pages
            ps, used = k.shape[1], seqused_k.tolist()
            ids = [block_table[b, : -(-n // ps)].long() for b, n in enumerate(used)]
            k, v = (torch.cat([t[i].reshape(-1, *t.shape[2:])[:n] for i, n in zip(ids, used)]) for t in (k, v))
            cu_seqlens_k = torch.tensor([0] + list(itertools.accumulate(used)))
        if cu_seqlens_q is not None:  # packed: per sequence; rows past the last one left alone
            cq, ckv = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
            lse = torch.full((q.shape[1], q.shape[0]), float("nan"))
            for b in range(len(cq) - 1):
                rq, rk = slice(cq[b], cq[b + 1]), slice(ckv[b], ckv[b + 1])
                o, _, lse[:, rq] = self.sw.attn_ref(q[rq], k[rk], v[rk], causal, scale, window)
                out[rq].copy_(o.to(out.dtype))
            if self.bad_tail and cq[-1]:
                out[cq[-1] - 1] += 1.0  # (a zeroed row could be a row that sees no key)
            return out, lse
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
        for i in range(q.shape[0]):
            o, _, lse[i] = self.sw.attn_ref(q[i], k[i], v[i], causal, scale, window)
            out[i].copy_(o.to(out.dtype))
        if self.bad_tail:
            out[:, -1] = 0
        return out, lse


def test_runners_on_cpu_stand_ins(monkeypatch):
    """The case runners end to end on the CPU (tensors, views, poisoning, references, checks) with a
    correct stand-in for each GPU-only op: every case passes; with a stand-in that zeroes the last row,
    every GEMM and forward case fails on its tail."""
    sw = _script("sweep")
    monkeypatch.setattr(sw, "RUN_DEV", "cpu")
    cases = []
    for op in sw.OPS:
        cs, _ = sw.select_cases(op, 12 if RUN_MATRIX else 6, 3, sw.BUDGET[op])  # the quick tier: 6 per op
        cases += [c for c in cs if not (c["op"] == "gemm" and (c["choice"] or c["m"] * c["n"] * c["k"] > 1e8))
                  and not (c["op"] == "flash_attn" and c["b"] * c["hq"] * c["sq"] * c["sk"] > 4e6)]
    assert {c["op"] for c in cases} == set(sw.OPS)
    monkeypatch.setattr(sw, "_ck", lambda: _Fake(sw))
    for c in cases:
        r = sw.run_case(c, "cpu")
        assert r["ok"], sw.case_line(c, r)
    monkeypatch.setattr(sw, "_ck", lambda: _Fake(sw, bad_tail=True))
    for c in cases:
        if c["op"] in ("gemm", "flash_attn"):
            if c["op"] == "flash_attn" and c["lens"] is not None and not sum(a for a, _ in c["lens"]):
                continue  # a packed batch of empty sequences has no row to get wrong
            r = sw.run_case(c, "cpu")
            assert not r["ok"] and r["tail"] > 1, sw.case_line(c, r)


def test_stress_covers_every_kernel_and_mode():
    """stress.py's cases plan (CPU) to every GEMM plan kind and forced kernel, both decode loads and
    several page sizes, Sq > 1 causal, each forward head dim causal and not, and merge."""
    st, sw = _script("stress"), _script("sweep")
    cs = st.select(st.cases(), list(sw.OPS), None)
    plans = {}
    for c in cs:
        plans[c["id"]] = sw.plan_case(c)[1]
    g = " | ".join(p for i, p in plans.items() if i.startswith("gemm"))
    for what in ("persistent 128x128", "128x256", "256x128", "defer", "/cpasync", "splitk-cluster",
                 "splitk-persistent", "swapped 128x16 S2", "swapped 128x32 S8", "cl1x2 S2", "swapped 128x64",
                 "forced cluster split-K mcast", "forced fixup split-K mcast", "direct-store"):
        assert what in g, what
    dec = [c for c in cs if c["op"] == "decode_attn"]
    d = " | ".join(plans[c["id"]] for c in dec)
    assert "tma" in d and "cpasync" in d and "P1" in d and "m64" in d
    assert {c["page"] for c in dec} >= {0, 16, 64, 256} and any(c["sq"] > 1 and c["causal"] for c in dec)
    fw = [c for c in cs if c["op"] == "flash_attn"]
    assert {(c["d"], c["causal"]) for c in fw} == {(d, k) for d in (64, 96, 128, 256) for k in (False, True)}
    assert {16, 48, 64} <= {c["page"] for c in fw} and any(c["page"] and c["window"] for c in fw)
    assert {1, 17, 129, 1000} <= {c["sq"] for c in fw} and {17, 129, 1000} <= {c["sk"] for c in fw}
    assert sum(c["op"] == "merge_states" for c in cs) >= 3
    assert len(st.select(st.cases(), ["gemm"], None)) == sum(c["op"] == "gemm" for c in cs)


def test_gpu_session_header_lists_every_step():
    script = (PROFILES / "gpu_session.sh").read_text()
    header = script.split("set -o pipefail", 1)[0]
    steps = [s for label in re.findall(r"^    ([\w|-]+)\) ", script, re.MULTILINE) for s in label.split("|")]
    assert {"stress", "sweep", "bench-model"} <= set(steps)
    missing = [s for s in steps if not re.search(rf"#\s+(\S+ / )?{re.escape(s)}\b", header)]
    assert not missing, f"gpu_session.sh steps missing from its header: {missing}"


def test_host_ab_stubbed_runs_both_trees(tmp_path):
    """profiles/host_ab.py --stub (no GPU): two workers (here both this tree), every row timed each
    round, paired differences and the bar in the table, the JSON written."""
    r = _run(str(PROFILES / "host_ab.py"), "--before", str(ROOT), "--after", str(ROOT), "--stub", "--rounds", "2",
             "--calls", "3", "--out", str(tmp_path), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    for row in ("gemm 64 out=", "decode 4 alloc", "flash out=", "decode out= / alloc alternating (2 calls)"):
        assert f"| {row} |" in r.stdout, r.stdout
    (path,) = tmp_path.glob("host-ab-*.json")
    import json

    doc = json.loads(path.read_text())
    assert doc["stub"] and len(doc["rows"]) == 13 and all(len(x["diff_us"]) == 3 for x in doc["rows"])


def test_peer_sass_overlap_counts_the_exponentials_between_the_waits():
    """``peer_sass.overlap``: the MUFU.EX2 between a loop's first ``WARPGROUP.DEPBAR.LE ... 0x1`` and the wait
    after it (the exponentials that overlap the in-flight GEMM), none counted outside."""
    peer_sass = _script("peer_sass")

    body = ["HGMMA.64x64x16.F32.BF16 R0, gdesc[UR4], RZ, gsb0", "MUFU.EX2 R1, R1", "WARPGROUP.DEPBAR.LE gsb0, 0x1",
            "FFMA R2, R2, R3, R4", "MUFU.EX2 R2, R2", "MUFU.EX2 R3, R3", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
            "MUFU.EX2 R5, R5"]
    assert peer_sass.overlap(body) == "3 instructions between the S wait and the next, 2 of 4 MUFU.EX2"
    assert peer_sass.overlap(body[:2]) == "no S / next-GEMM wait pair"


def test_bwd_order_model_lpt_beats_the_grid_order_on_a_causal_shape():
    """``bwd_order_model``: with the kernel's own lpt mapping, the causal b16 h16 s1024 grid's modelled makespan
    drops (the last head's longest CTA no longer starts last), the full shapes' does not change."""
    m = _script("bwd_order_model")

    grid, lpt = m.orders(16, 16, 1024, 128, 64)
    cost = {cta: 1 + 16 - (cta[0] * 128) // 64 for cta in grid}
    assert m.makespan(lpt, cost) < 0.97 * m.makespan(grid, cost)
    flat = {cta: 17 for cta in grid}
    assert m.makespan(lpt, flat) == m.makespan(grid, flat)

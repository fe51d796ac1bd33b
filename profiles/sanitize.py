"""Small cases for compute-sanitizer (memcheck / racecheck / synccheck).

    python3 profiles/sanitize.py            # warm the compile cache (run once without the sanitizer)
    compute-sanitizer --tool memcheck python3 profiles/sanitize.py

Each case is checked against a float64 reference and prints one line; the exit status is the number
of wrong results.  Cases cover the TMA-store epilogue, the predicated direct-store epilogue (ragged,
misaligned D), batched L, alpha/beta with C, the cluster split-K, the skinny plan's A-multicast pairs
(DSMEM kernel, and the fixup kernel with them), the deferred epilogue with PDL, and one decode call
with splits.
"""
import importlib
import os
import sys

import torch

import cute_kernels
from cute_kernels.gemm import heuristics as GHe
from cute_kernels.gemm import launch as GL
from cute_kernels.gemm import plan as GP

torch.manual_seed(0)
bad = 0


def check(name, out, ref, tol=2e-2):
    global bad
    err = ((out.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    ok = err < tol
    bad += not ok
    print(f"{name}: rel err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)


def mm(m, n, k, *, l=None, a_col=False, b_col=False, beta=0.0, splits=None):
    lead = () if l is None else (l,)
    a = torch.randn(*lead, k, m, device="cuda", dtype=torch.bfloat16).transpose(-1, -2) if a_col else \
        torch.randn(*lead, m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(*lead, n, k, device="cuda", dtype=torch.bfloat16).transpose(-1, -2) if b_col else \
        torch.randn(*lead, k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.randn(*lead, m, n, device="cuda", dtype=torch.bfloat16) if beta else None
    out = GP.run(a, b, None, c, 1.5, beta, choice=GP.PlanChoice(splits=splits))
    torch.cuda.synchronize()
    ref = 1.5 * (a.double() @ b.double()) + (beta * c.double() if beta else 0)
    check(f"gemm {lead}{m}x{n}x{k} a_col={a_col} b_col={b_col} beta={beta} splits={splits}", out, ref)


mm(256, 256, 256)                       # full tiles, TMA store
mm(200, 136, 72, a_col=True)            # ragged M/N/K, TMA OOB fill
mm(7, 129, 64, b_col=True)              # D rows not 16-byte aligned -> direct stores
mm(130, 264, 200, l=3, beta=0.5)        # batched, alpha/beta with C
mm(128, 256, 1024, splits=2)            # cluster split-K (DSMEM reduction)


def defer(m, n, k):
    """The deferred epilogue on one cluster (max_active_clusters=1): several tiles per CTA, so each
    tile's sub-tiles are stored during the next tile's mainloop (k-tiles >= sub-tiles) or after it
    (K < 4 k-tiles; K keeps rows 16-byte multiples, else the plan is cp.async); launched twice back to back with PDL, the second reading the first's output."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    b2 = torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / 16
    choice = GP.PlanChoice(epi_defer=True, max_active_clusters=1)
    out = GP.run(a, b, None, None, 1.5, choice=choice)
    out2 = GP.run(out, b2, choice=choice)
    torch.cuda.synchronize()
    check(f"gemm deferred epilogue {m}x{n}x{k}, 1 cluster", out, 1.5 * (a.double() @ b.double()))
    check(f"gemm deferred epilogue, PDL chain {m}x{n}x{n}", out2, out.double() @ b2.double())


def splitk_mcast(kind, tn, s, c, m, n, k):
    """Split-K kernels with A multicast along N (cluster S x c / 1 x c, the skinny plan's pairs): remote
    empty-barrier arrivals, padding CTAs in a partial last cluster (N tiles not a multiple of c)."""
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig, fixup_workspace_numel

    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    tiles = GHe.splitk_tiles(tn, "bfloat16", "k", "mn", "bfloat16", c)
    if kind == "cluster":
        fn = GL.compiled(SplitKClusterConfig(tiles=tiles, splits=s, vec_store=True, b_evict_first=True),
                         "bfloat16", "bfloat16", "bfloat16")
    else:
        fn = GL.WorkspaceLauncher(GL.compiled(SplitKFixupConfig(tiles=tiles, splits=s), "bfloat16", "bfloat16",
                                              "bfloat16"), *fixup_workspace_numel(m, n, tn, s))
    fn(a, b, out, out, 1.0, 0.0)
    torch.cuda.synchronize()
    check(f"{kind} split-K tn{tn} S={s} A multicast {c}: {m}x{n}x{k}", out, a.double() @ b.double())


splitk_mcast("cluster", 32, 1, 2, 130, 296, 1000)   # 10 N tiles of 32 in 5 clusters of 1 x 2
splitk_mcast("fixup", 32, 2, 2, 130, 200, 1000)     # 7 N tiles: the last pair's second CTA pads
defer(520, 776, 264)                    # 5 k-tiles, ragged, 5 x 4 tiles of 128 x 192 on one cluster
defer(300, 520, 104)                    # 2 k-tiles < 4 sub-tiles: stores after the mainloop
if os.environ.get("SKIP_DECODE") is None:
    DA = importlib.import_module("cute_kernels.attention.decode")
    q = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(2, 1000, 2, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    lens = torch.tensor([1000, 333], device="cuda", dtype=torch.int32)
    o = cute_kernels.decode_attn(q, kc, vc, cache_seqlens=lens, num_splits=4)
    torch.cuda.synchronize()
    ref, _ = DA.decode_attn_reference(q, kc, vc, lens)
    check("decode b2 hq8 hkv2 L1000 splits=4", o, ref.double())


def fwd(b, sq, sk, hq, hkv, d, causal):
    """flash_attn on ragged lengths (tails in both Q and K/V tiles, GQA, causal rows with no key)."""
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    out = torch.full_like(q, float("nan"))
    cute_kernels.flash_attn(q, k, v, causal=causal, out=out)
    torch.cuda.synchronize()
    qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
    kd, vd = kd.repeat_interleave(hq // hkv, 1), vd.repeat_interleave(hq // hkv, 1)
    s = (qd @ kd.transpose(-1, -2)) / d ** 0.5
    if causal:  # bottom-right: query i sees keys j <= i + sk - sq
        i = torch.arange(sq, device="cuda")[:, None]
        s = s.masked_fill(torch.arange(sk, device="cuda")[None, :] > i + sk - sq, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no key: 0
    check(f"flash_attn b{b} sq{sq} sk{sk} hq{hq} hkv{hkv} d{d} causal={causal}", out, (p @ vd).transpose(1, 2))


if os.environ.get("SKIP_FORWARD") is None:
    fwd(2, 200, 77, 4, 1, 128, False)   # K/V tail in the only KV tile, Q tail in the second query tile
    fwd(1, 300, 130, 8, 2, 64, True)    # causal with Sq > Sk: the first 170 rows see no key
    fwd(1, 17, 1000, 2, 2, 128, True)   # one partial query tile against 8 KV tiles, diagonal masked
sys.exit(bad)

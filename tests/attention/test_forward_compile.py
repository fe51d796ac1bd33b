"""Attention forward kernel, CPU side: the tile descriptions, the KV-tile walk and mask rules against
brute force (the kernel's index math, emulated tile by tile in torch), and every configuration
(D x causal x dtype) compiling for sm_90a with tensor-core instructions and no local-memory traffic.
The GPU tests are in ``test_forward.py``."""

import dataclasses
import itertools
import math

import pytest
import torch

from cute_kernels.attention import forward_config
from cute_kernels.attention import forward_softmax as fs
from layouts import attention as LA
from _check import WINDOWS, visible_window  # noqa: E402

CONFIGS = list(itertools.product(("bfloat16", "float16"), LA.FWD_HEAD_DIMS, (False, True)))


# ------------------------------------------------------------------------------------------ tiles
@pytest.mark.parametrize("dtype,head_dim,causal", CONFIGS)
def test_fwd_tile_fits(dtype, head_dim, causal):
    t = LA.fwd_tile(dtype, head_dim, causal)
    assert t.tile_m % 64 == 0 and t.consumer_warpgroups == t.tile_m // 64
    assert t.smem_bytes() <= LA.FWD_SMEM_CAPACITY
    assert t.tile_regs_per_thread <= t.consumer_regs - LA.FWD_REG_OVERHEAD
    producer, consumer = t.producer_regs, t.consumer_regs
    assert 128 * producer + t.consumer_warpgroups * 128 * consumer <= 65536  # the register file
    assert t.pingpong == (head_dim != 256)
    hash(t)


def test_fwd_tile_rejects():
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 80)  # head dim
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 128, tile_m=256)  # four consumer warpgroups
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 64, tile_m=64)  # ping-pong needs two consumer warpgroups
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 256, tile_n=128)  # S + P + O: 64 + 32 + 128 registers
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 128, stages=8)  # does not fit in shared memory
    with pytest.raises(ValueError):
        LA.FwdTile("bfloat16", 128, tile_n=100)


# ------------------------------------------------------------------------------------------ index math
def visible(q, k, Sq, Sk, causal):
    return k < Sk and (not causal or k <= q + Sk - Sq)


@pytest.mark.parametrize("causal", [False, True])
def test_kv_tile_range_brute_force(causal):
    """Every visible (q, k) of a real row lies in a visited tile; tiles below n_mask hold only visible
    pairs for every real row; tiles >= n_max hold none."""
    tm, tn = 16, 8  # small tiles: many tiles per length
    for Sq, Sk in itertools.product((1, 5, 16, 17, 33, 64), (1, 7, 8, 17, 40, 64)):
        for m in range(-(-Sq // tm)):
            n_max, n_mask = fs.kv_tile_range_py(m, Sq, Sk, tm, tn, causal)
            assert 0 <= n_mask <= n_max
            rows = range(m * tm, min((m + 1) * tm, Sq))
            for n in range(-(-max(Sk, 1) // tn) + 1):
                keys = range(n * tn, (n + 1) * tn)
                vis = [visible(q, k, Sq, Sk, causal) for q in rows for k in keys]
                if n >= n_max:
                    assert not any(vis), (Sq, Sk, m, n)
                if n < n_mask:
                    assert all(vis), (Sq, Sk, m, n)


@pytest.mark.parametrize("causal", [False, True])
def test_tile_coords_cover_every_tile_once(causal):
    """The 1-d grid's CTA -> (query tile, head, batch) map is a bijection, for full and partial L2
    sections; each head's query tiles come in order, longest (last) first when causal."""
    cases = [(1, 1, 1, 17, 1), (5, 3, 2, 4097, 1), (33, 24, 3, 8192, 8), (4, 32, 4, 4096, 1),
             (7, 40, 3, 300_000, 4), (2, 72, 1, 1 << 20, 1)]
    for m_blocks, heads, batch, Sk, G in cases:
        seen = set()
        n = m_blocks * heads * batch
        order = [forward_config.tile_coords_py(b, m_blocks, heads, batch, Sk, G, 512, causal) for b in range(n)]
        for m, h, bb in order:
            assert 0 <= m < m_blocks and 0 <= h < heads and 0 <= bb < batch
            seen.add((m, h, bb))
        assert len(seen) == n, (m_blocks, heads, batch, Sk, G)
        assert order[0][0] == (m_blocks - 1 if causal else 0)
        for hb in {(h, bb) for _, h, bb in order}:
            ms = [m for m, h, bb in order if (h, bb) == hb]
            assert ms == (sorted(ms, reverse=True) if causal else sorted(ms)), hb


def emulate_walk(q, k, v, tm, tn, walk):
    """The kernel's algorithm on one (batch, head) in float64, for the KV walk ``walk(m, rows, Sq, Sk)``
    of query tile m: the (tile n, mask) pairs in visiting order, mask None for a plain tile or a
    function of the tile's key indices giving the (tm, tn) masked-out entries.  Zero-filled rows past
    Sq / Sk (TMA), the online softmax (exp2, scaled max 0 for empty rows), deferred normalization,
    natural-log LSE."""
    Sq, D = q.shape
    Sk = k.shape[0]
    scale_log2 = D ** -0.5 * math.log2(math.e)
    o = torch.zeros(Sq, D, dtype=torch.float64)
    lse = torch.zeros(Sq, dtype=torch.float64)
    for m in range(-(-Sq // tm)):
        r0 = m * tm
        rows = torch.arange(r0, r0 + tm)
        qt = torch.zeros(tm, D, dtype=torch.float64)
        qt[: min(tm, Sq - r0)] = q[r0 : r0 + tm].double()  # zero-filled rows past Sq
        mx = torch.full((tm,), -math.inf, dtype=torch.float64)
        l = torch.zeros(tm, dtype=torch.float64)
        acc = torch.zeros(tm, D, dtype=torch.float64)
        for n, mask in walk(m, rows, Sq, Sk):
            kt = torch.zeros(tn, D, dtype=torch.float64)
            vt = torch.zeros(tn, D, dtype=torch.float64)
            kt[: max(0, min(tn, Sk - n * tn))] = k[n * tn : (n + 1) * tn].double()
            vt[: max(0, min(tn, Sk - n * tn))] = v[n * tn : (n + 1) * tn].double()
            s = qt @ kt.T
            if mask is not None:
                s[mask(n * tn + torch.arange(tn))] = -math.inf
            m_new = torch.maximum(mx, s.amax(1))
            m_s = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new * scale_log2)
            p = torch.exp2(s * scale_log2 - m_s[:, None])
            corr = torch.exp2(mx * scale_log2 - m_s)
            l = l * corr + p.sum(1)
            acc = acc * corr[:, None] + p @ vt
            mx = m_new
        m_s = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx * scale_log2)
        inv = torch.where(l > 0, 1.0 / l, torch.zeros_like(l))
        lse_t = torch.where(l > 0, (m_s + torch.log2(l)) * math.log(2.0), torch.full_like(l, -math.inf))
        keep = min(tm, Sq - r0)
        o[r0 : r0 + keep] = (acc * inv[:, None])[:keep]
        lse[r0 : r0 + keep] = lse_t[:keep]
    return o, lse


def emulate_forward(q, k, v, causal, tm, tn):
    """:func:`emulate_walk` with the dense walk of kv_tile_range (masked tiles first, from the last one
    down) and the mask rule of apply_mask."""
    def walk(m, rows, Sq, Sk):
        n_max, n_mask = fs.kv_tile_range_py(m, Sq, Sk, tm, tn, causal)
        limit = torch.full((tm,), Sk, dtype=torch.int64)
        if causal:
            limit = torch.minimum(limit, rows + Sk - Sq + 1)

        def mask(cols):
            return cols[None, :] >= limit[:, None]
        return [(n, mask if n >= n_mask else None) for n in range(n_max - 1, -1, -1)]

    return emulate_walk(q, k, v, tm, tn, walk)


@pytest.mark.parametrize("ncols", [8, 32, 48, 64])
def test_mask_bits_match_the_compare_rule(ncols):
    """apply_mask's keep-bits (thread 0's columns 0, 1, 8, 9, ... below a limit form a prefix, counted by
    pair_columns_below, set in 32-bit chunks by prefix_bits) keep exactly the columns the per-score rule
    keeps: ``col < limit``; a window's band ``lo <= col < hi`` is the difference of two prefixes."""
    cols = [8 * (c // 2) + c % 2 for c in range(ncols)]

    def kept(bits_of_chunk):
        return [bool(bits_of_chunk(c // fs.MASK_CHUNK) >> (c % fs.MASK_CHUNK) & 1) for c in range(ncols)]

    limits = range(-40, 4 * ncols + 40)
    for limit in limits:
        n = fs.pair_columns_below_py(limit)
        assert kept(lambda ch: fs.prefix_bits_py(n, ch)) == [col < limit for col in cols], limit
    for lo, hi in itertools.product(range(-20, 2 * ncols + 20, 3), range(-20, 4 * ncols + 20, 5)):
        n_lo, n_hi = fs.pair_columns_below_py(lo), fs.pair_columns_below_py(hi)
        got = kept(lambda ch: fs.prefix_bits_py(n_hi, ch) & ~fs.prefix_bits_py(n_lo, ch))
        assert got == [lo <= col < hi for col in cols], (lo, hi)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (17, 1000), (1000, 17), (128, 128), (200, 77), (5, 300), (300, 300)])
def test_emulated_walk_matches_reference(causal, Sq, Sk):
    """The kernel's tile walk + masks, emulated at the real tile size (128 x 128), equals attention."""
    g = torch.Generator().manual_seed(0)
    D = 16
    q, k, v = (torch.randn(n, D, generator=g, dtype=torch.float64) for n in (Sq, Sk, Sk))
    o, lse = emulate_forward(q, k, v, causal, 128, 128)
    s = (q @ k.T) * D ** -0.5
    if causal:
        qi = torch.arange(Sq)[:, None]
        kj = torch.arange(Sk)[None, :]
        s = s.masked_fill(kj > qi + Sk - Sq, -math.inf)
    ref_lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(ref_lse)
    p = torch.where(empty[:, None], torch.zeros_like(s), torch.softmax(s, -1).nan_to_num(0.0))
    ref_o = p @ v
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.allclose(o, ref_o, atol=1e-10)
    assert torch.allclose(lse[~empty], ref_lse[~empty], atol=1e-10)
    assert (o[empty] == 0).all()


# ------------------------------------------------------------------------------------------ compile
def compile_clean(cfg, window: bool = False):
    """Compile ``cfg`` for sm_90a and check what every forward config must show: one kernel, no
    local-memory traffic or stack, the wgmma bodies of the KV loop -- the first tile's QK, the masked
    and the unmasked loops (QK + PV each), the last PV, a window's left-edge loop one more:
    (3 or 4) x (D/16 QK k-blocks + tile_n/16 PV k-blocks) -- and TMA loads and stores.  Returns the
    report and its kernel."""
    from cute_kernels.attention.forward_kernel import forward_builder
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(forward_builder(cfg))
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert k.spills == 0, rep.summary()
    assert k.stack_frame == 0, rep.summary()
    bodies = 4 if window else 3
    assert k.instructions["HGMMA"] == bodies * (cfg.head_dim // 16 + cfg.tile.tile_n // 16), rep.summary()
    assert k.instructions["UTMALDG"] > 0 and k.instructions["UTMASTG"] > 0, rep.summary()
    return rep, k


@pytest.mark.parametrize("dtype,head_dim,causal", CONFIGS)
def test_forward_compiles_without_spills(dtype, head_dim, causal):
    from cute_kernels.attention.forward_kernel import FlashFwdConfig, fwd_config

    cfg = fwd_config(dtype, head_dim, causal)
    assert isinstance(cfg, FlashFwdConfig)
    hash(cfg)
    rep, k = compile_clean(cfg)
    assert k.instructions["LDG"] == 0, rep.summary()  # everything is loaded by TMA
    if causal:  # the diagonal's keep-bits (apply_mask), not a compare per score
        assert k.instructions["R2P"] > 0, rep.summary()


# ------------------------------------------------------------------------------------------ windows, varlen


@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{l}_{r}" for l, r in WINDOWS])
def test_kv_tile_range_window_brute_force(window):
    """Every visible (q, k) of a real row lies in a visited tile; tiles n_lo .. n_hi - 1 hold only
    visible pairs for every real row; tiles outside n_min .. n_max - 1 hold none, and the range is as
    tight as tile granularity allows (its first and last tiles hold a visible pair of some row of the
    tile, counting the rows past Sq the kernel computes and discards)."""
    left, right = window
    tm, tn = 16, 8
    for Sq, Sk in itertools.product((1, 5, 16, 17, 33, 64), (1, 7, 8, 17, 40, 64)):
        for m in range(-(-Sq // tm)):
            n_min, n_max, n_lo, n_hi = fs.kv_tile_range_window_py(m, Sq, Sk, tm, tn, left, right)
            assert 0 <= n_min <= n_lo <= n_hi <= n_max <= -(-Sk // tn), (Sq, Sk, m)
            rows = range(m * tm, min((m + 1) * tm, Sq))
            all_rows = range(m * tm, (m + 1) * tm)
            for n in range(-(-Sk // tn) + 1):
                keys = range(n * tn, (n + 1) * tn)
                vis = [visible_window(q, k, Sq, Sk, left, right) for q in rows for k in keys]
                if n >= n_max or n < n_min:
                    assert not any(vis), (Sq, Sk, m, n)
                if n_lo <= n < n_hi:
                    assert all(vis), (Sq, Sk, m, n)
            if n_max > n_min:
                for n in (n_min, n_max - 1):
                    assert any(visible_window(q, k, Sq, Sk, left, right) for q in all_rows
                               for k in range(n * tn, (n + 1) * tn)), (Sq, Sk, m, n)


@pytest.mark.parametrize("causal", [False, True])
def test_window_range_reduces_to_causal_and_full(causal):
    """(-1, -1) and (-1, 0) give the dense ranges: n_min = n_lo = 0, the same n_max and unmasked tiles."""
    for Sq, Sk in itertools.product((1, 17, 33, 64), (1, 8, 17, 64)):
        for m in range(-(-Sq // 16)):
            n_max, n_mask = fs.kv_tile_range_py(m, Sq, Sk, 16, 8, causal)
            assert fs.kv_tile_range_window_py(m, Sq, Sk, 16, 8, -1, 0 if causal else -1) == (0, n_max, 0, n_mask)


def emulate_window_forward(q, k, v, left, right, tm, tn):
    """:func:`emulate_walk` with the window walk: tiles n_max - 1 .. n_hi masked, n_hi - 1 .. n_lo plain,
    n_lo - 1 .. n_min masked (the first one always masked), the mask of apply_window_mask."""
    wl = fs.WINDOW_UNBOUNDED if left < 0 else left
    wr = fs.WINDOW_UNBOUNDED if right < 0 else right

    def walk(m, rows, Sq, Sk):
        n_min, n_max, n_lo, n_hi = fs.kv_tile_range_window_py(m, Sq, Sk, tm, tn, left, right)
        p = rows + Sk - Sq
        hi = torch.minimum(torch.full((tm,), Sk), p + wr + 1)
        lo = p - wl

        def mask(cols):
            return (cols[None, :] >= hi[:, None]) | (cols[None, :] < lo[:, None])
        order = range(n_max - 1, n_min - 1, -1)
        return [(n, mask if i == 0 or not (n_lo <= n < n_hi) else None) for i, n in enumerate(order)]

    return emulate_walk(q, k, v, tm, tn, walk)


@pytest.mark.parametrize("window", [(0, 0), (5, 0), (0, 7), (40, 3), (130, 130), (300, -1), (-1, 200), (1000, 1000)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (17, 300), (300, 17), (200, 200), (333, 777)])
def test_emulated_window_walk_matches_reference(window, Sq, Sk):
    """The kernel's window walk + masks, emulated at 128 x 128 tiles, equals masked attention (rows
    that see nothing: O = 0, LSE = -inf)."""
    g = torch.Generator().manual_seed(1)
    D = 16
    q, k, v = (torch.randn(n, D, generator=g, dtype=torch.float64) for n in (Sq, Sk, Sk))
    o, lse = emulate_window_forward(q, k, v, *window, 128, 128)
    left, right = window
    vis = torch.tensor([[visible_window(i, j, Sq, Sk, left, right) for j in range(Sk)] for i in range(Sq)])
    s = ((q @ k.T) * D ** -0.5).masked_fill(~vis, -math.inf)
    ref_lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(ref_lse)
    ref_o = torch.softmax(s, -1).nan_to_num(0.0) @ v
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.allclose(o, ref_o, atol=1e-10)
    assert torch.allclose(lse[~empty], ref_lse[~empty], atol=1e-10)
    assert (o[empty] == 0).all()


# (varlen, window, causal): packed sequences with and without a window, dense windows
EXT_CONFIGS = [(True, False, False), (True, False, True), (False, True, False), (True, True, False)]


@pytest.mark.matrix  # the quick tier compiles packed + window through the paged and variants tests
@pytest.mark.parametrize("head_dim", LA.FWD_HEAD_DIMS)
@pytest.mark.parametrize("varlen,window,causal", EXT_CONFIGS,
                         ids=["varlen", "varlen-causal", "window", "varlen-window"])
def test_varlen_window_compile_without_spills(varlen, window, causal, head_dim):
    """Varlen / window configurations compile for sm_90a with no local-memory traffic; varlen keeps
    the dense tile's schedule (persistent, dynamic when causal); a window adds the left-edge loop
    (one more QK + PV body)."""
    from cute_kernels.attention.forward_kernel import fwd_config

    cfg = fwd_config("bfloat16", head_dim, causal, varlen=varlen, window=window)
    assert cfg.varlen == varlen and cfg.window == window
    assert cfg.tile == fwd_config("bfloat16", head_dim, causal, window=window).tile
    rep, k = compile_clean(cfg, window)
    print(f"D={head_dim} varlen={varlen} window={window} causal={causal}: {rep.summary()}")
    if varlen:  # cu_seqlens (producer + consumers) and the partial tile's predicated stores
        assert k.instructions["LDG"] > 0 and k.instructions["STG"] > 0, rep.summary()
    else:
        assert k.instructions["LDG"] == 0, rep.summary()


def test_window_config_rules():
    from cute_kernels.attention.forward_kernel import FlashFwdConfig, fwd_config

    with pytest.raises(ValueError, match="folds causal"):
        fwd_config("bfloat16", 128, True, window=True)
    with pytest.raises(ValueError, match="does not match"):
        FlashFwdConfig("bfloat16", 128, False, LA.fwd_tile("bfloat16", 64, False), varlen=True)
    assert fwd_config("bfloat16", 128, False) != fwd_config("bfloat16", 128, False, window=True)


# ------------------------------------------------------------------------------------------ paged K/V
# (page_size, varlen, window, causal)
PAGED_CONFIGS = [(ps, v, w, c) for ps in (16, 64, 256) for (v, w, c) in ((False, False, True), (True, True, False))]
PAGED_CONFIGS += [(48, False, False, False), (48, True, False, True)]


@pytest.mark.parametrize("head_dim", LA.FWD_HEAD_DIMS)
@pytest.mark.parametrize("page_size,varlen,window,causal", PAGED_CONFIGS,
                         ids=[f"ps{p}-{'varlen' if v else 'dense'}{'-window' if w else ''}{'-causal' if c else ''}"
                              for p, v, w, c in PAGED_CONFIGS])
def test_paged_compile_without_spills(page_size, varlen, window, causal, head_dim):
    """Paged K/V configurations compile for sm_90a with no local-memory traffic (the producer's
    block-table walk fits its registers); the same wgmma bodies as the contiguous kernel; every K/V
    box is a TMA load; the block table and lengths are the only global loads besides cu_seqlens."""
    from cute_kernels.attention import forward_paged as fpg
    from cute_kernels.attention.forward_kernel import fwd_config

    cfg = fwd_config("bfloat16", head_dim, causal, varlen=varlen, window=window, page_size=page_size)
    assert cfg.paged and cfg.page_size == page_size
    rep, k = compile_clean(cfg, window)
    rows = fpg.box_rows(page_size, cfg.tile.tile_n)
    print(f"D={head_dim} page_size={page_size} box={rows} varlen={varlen} window={window} causal={causal}: "
          f"{rep.summary()}")
    assert k.instructions["LDG"] > 0, rep.summary()  # block table, seqused_k
    assert rows % 16 == 0 and page_size % rows == 0 and cfg.tile.tile_n % rows == 0


@pytest.mark.parametrize("head_dim,causal,window,kw", [
    (96, False, False, dict(tile_m=192)), (96, True, False, dict(tile_m=192)),
    (128, False, True, {}),
], ids=["d96-m192", "d96-m192-causal", "d128-window"])
def test_p_smem_compiles_without_spills(head_dim, causal, window, kw):
    """``FwdTile.p_smem``: P through shared memory (stmatrix) as the PV wgmma's A operand, so three
    192-row warpgroups fit D = 96 at 160 registers; no local memory, every PV wgmma reads A by
    descriptor, and the P buffer counts in the tile's shared memory."""
    import dataclasses

    from cute_kernels.attention.forward_kernel import fwd_config

    cfg = fwd_config("bfloat16", head_dim, causal, window=window)
    tile = dataclasses.replace(cfg.tile, p_smem=True, **kw)
    assert tile.p_bytes == tile.tile_m * tile.tile_n * 2 and tile.smem_bytes() <= LA.FWD_SMEM_CAPACITY
    rep, k = compile_clean(dataclasses.replace(cfg, tile=tile), window)
    assert k.instructions["STSM"] > 0, rep.summary()
    pv = [ln for ln in rep.sass.splitlines() if f"HGMMA.64x{head_dim}x16" in ln]
    assert pv and all("gdesc" in ln.split(",")[1] for ln in pv), pv[:2]  # A from shared memory
    with pytest.raises(ValueError, match="registers"):  # P in registers does not fit three warpgroups at D 96
        dataclasses.replace(fwd_config("bfloat16", 96, False).tile, tile_m=192)


@pytest.mark.parametrize("softcap", [False, True], ids=["plain", "softcap"])
def test_softmax_only_bound_keeps_the_softmax(softcap):
    """``FlashFwdConfig.softmax_only`` (the softmax bound beside ``mma_only``): no wgmma at all, and every
    MUFU instruction of the full kernel still there (the scores it makes up do not fold away)."""
    import dataclasses

    from cute_kernels.attention.forward_kernel import forward_builder, fwd_config
    from cute_kernels.tools import inspect as ins

    full = fwd_config("bfloat16", 128, False, softcap=softcap)
    reps = [ins.inspect_builder(forward_builder(c)) for c in (full, dataclasses.replace(full, softmax_only=True))]
    (kf,), (kb,) = (r.kernels for r in reps)
    assert kf.instructions["HGMMA"] > 0 and kb.instructions.get("HGMMA", 0) == 0, reps[1].summary()
    assert kb.spills == 0 and kb.stack_frame == 0, reps[1].summary()
    for op in ("MUFU.EX2", "MUFU.TANH"):
        assert reps[1].sass.count(op) == reps[0].sass.count(op), op
    assert reps[0].sass.count("MUFU.EX2") > 0 and (reps[0].sass.count("MUFU.TANH") > 0) == softcap
    with pytest.raises(ValueError, match="two different bounds"):
        dataclasses.replace(fwd_config("bfloat16", 128, False), mma_only=True, softmax_only=True)


def test_prefetch_tile_claims_before_the_loads():
    """``FwdTile.prefetch_tile`` (the dynamic schedule's next tile claimed before the current one's loads):
    compiles as every forward config must (compile_clean), the producer's tile atomic now ahead of the first
    TMA load in the SASS (the default's follows its loads), and it needs the dynamic schedule."""
    from cute_kernels.attention.forward_kernel import fwd_config
    from layouts.attention import FwdTile

    cfg = fwd_config("bfloat16", 128, True)
    assert cfg.tile.dynamic and not cfg.tile.prefetch_tile
    pre = dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, prefetch_tile=True))

    def first(sass, op):
        return next(i for i, line in enumerate(sass.splitlines()) if op in line)

    rep, _ = compile_clean(pre)
    rep0, _ = compile_clean(cfg)
    assert first(rep.sass, "ATOMG") < first(rep.sass, "UTMALDG")
    assert first(rep0.sass, "ATOMG") > first(rep0.sass, "UTMALDG")
    with pytest.raises(ValueError, match="prefetch_tile"):
        FwdTile("bfloat16", 128, prefetch_tile=True)

"""Attention backward, CPU side: the tile descriptions, the query-tile walk of a KV tile and its mask
against brute force, the whole tile algorithm emulated in float64 against autograd (padding rows,
LSE_log2 = +inf conventions, GQA sums), and every kernel (main, pre-pass, post-pass; D x causal x
dtype) compiling for sm_90a with no local-memory traffic.  The GPU tests are in ``test_backward.py``."""

import collections
import dataclasses
import itertools
import math
import re

import pytest
import torch

from cute_kernels.attention import backward_config as bc
from cute_kernels.attention import backward_kernel as bk
from cute_kernels.attention import backward_mask as bm
from layouts import attention as LA
from layouts import attention_backward as LB
from _check import WINDOWS, visible_window  # noqa: E402

CONFIGS = list(itertools.product(("bfloat16", "float16"), LB.BWD_HEAD_DIMS, (False, True)))


# ------------------------------------------------------------------------------------------ tiles
@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
def test_bwd_tile_fits(head_dim):
    t = LB.bwd_tile("bfloat16", head_dim)
    assert t.smem_bytes() <= LA.FWD_SMEM_CAPACITY
    assert 128 * t.producer_regs + t.consumer_warpgroups * 128 * t.consumer_regs <= 65536
    assert LB.BWD_ROW_PAD % t.tile_m == 0
    # S^T, dP^T (fp32) + dK, dV (fp32) per consumer thread, with room for the rest; split by head dims
    # (D = 256): half the queries of S^T / dP^T and half the columns of dK / dV per warpgroup
    split = 2 if t.kv_split_d else 1
    assert t.kv_split_d == (head_dim == 256)
    regs = 2 * (64 * t.tile_m // 128 // split) + 2 * (64 * head_dim // 128 // split)
    assert regs <= t.consumer_regs - 32
    assert t.ds_buffers == (2 if t.kv_split_d else t.stages)
    hash(t)


def test_bwd_tile_rejects():
    with pytest.raises(ValueError):
        LB.BwdTile("bfloat16", 256)
    with pytest.raises(ValueError):
        LB.BwdTile("bfloat16", 128, tile_n=192)
    with pytest.raises(ValueError):
        LB.BwdTile("bfloat16", 128, tile_m=128)  # a column split of dQ needs 64 rows
    with pytest.raises(ValueError):
        LB.BwdTile("bfloat16", 128, stages=8)  # shared memory
    with pytest.raises(ValueError, match="2 stages"):
        LB.BwdTile("bfloat16", 128, stages=1)  # a dS^T buffer per stage
    with pytest.raises(ValueError, match="kv_split_d"):
        LB.BwdTile("bfloat16", 256, tile_n=128, kv_split_d=True)
    with pytest.raises(ValueError, match="kv_split_d"):
        LB.BwdTile("bfloat16", 256, tile_n=64, stages=2, kv_split_d=True)


# ------------------------------------------------------------------------------------------ index math
def visible(q, k, Sq, Sk, causal):
    return k < Sk and (not causal or k <= q + Sk - Sq)


def _turns_finish(Sq, Sk, tm, tn, window, capacity):
    """Simulate one (sequence, head)'s KV-tile CTAs in the deterministic mode: launched in ascending
    order, at most ``capacity`` resident, each walking its query tiles in the kernel's order and adding
    at a query tile only on its turn (as many adds there before it as its turn number).  True when all
    finish, False when every resident CTA waits (the GPU would hang)."""
    N, M = -(-Sk // tn), -(-Sq // tm)
    walks, turns = [], []
    for n in range(N):
        if window is None:
            rot = bm.dense_rotation_py(n, Sq, Sk, tm, tn)
            walks.append([(rot + i) % M for i in range(M)])
            turns.append(lambda m, n=n: bm.dense_turn_py(n, m, Sq, Sk, tm, tn))
        else:
            if window == "causal":
                m_min, m_max, _ = bm.m_block_range_py(n, Sq, Sk, tm, tn, True)
                right = 0
            else:
                m_min, m_max, _, _ = bm.m_block_range_window_py(n, Sq, Sk, tm, tn, *window)
                right = window[1]
            walks.append(list(range(m_min, m_max)))
            turns.append(lambda m, n=n, r=right: bm.n_block_last_py(m, Sq, Sk, tm, tn, r) - n)
    adds, pos, resident, launched = {}, [0] * N, [], 0
    while True:
        while len(resident) < capacity and launched < N:
            resident.append(launched)
            launched += 1
        if not resident:
            return True
        moved = False
        for n in list(resident):
            if pos[n] == len(walks[n]):
                resident.remove(n)
                moved = True
                continue
            m = walks[n][pos[n]]
            if adds.get(m, 0) == turns[n](m):
                adds[m] = adds.get(m, 0) + 1
                pos[n] += 1
                moved = True
        if not moved:
            return False


@pytest.mark.parametrize("window", [None, "causal", (24, 0), (40, 16), (-1, 0), (16, -1)], ids=str)
def test_det_wait_span_is_what_the_turns_need_resident(window):
    """``det_wait_span`` against a simulation of the turns with a limited number of resident CTAs: the
    turns finish whenever the span fits (what the host's refusal relies on), and for causal masks and
    dense rotated ranges they hang as soon as it does not."""
    tm, tn = 8, 16
    for Sq, Sk in itertools.product((8, 40, 100, 300), (16, 70, 160, 300)):
        N, M = -(-Sk // tn), -(-Sq // tm)
        w = None if window in (None, "causal") else window
        span = bm.det_wait_span(N, M, window == "causal", w, tm, tn)
        assert 1 <= span <= N
        for capacity in sorted({1, 2, 3, span - 1, span, span + 1, N} - {0}):
            finish = _turns_finish(Sq, Sk, tm, tn, window, capacity)
            if capacity >= span:
                assert finish, (Sq, Sk, window, capacity, span)
            elif window == "causal" or (window is None and N <= M):
                assert not finish, (Sq, Sk, window, capacity, span)


@pytest.mark.parametrize("causal", [False, True])
def test_m_block_range_brute_force(causal):
    """Every visible (q, k) of a real row lies in a visited query tile of k's KV tile; tiles outside
    m_min .. m_max - 1 hold none; tiles m_mask .. m_max - 1 hold only visible pairs (every real row,
    every key of the KV tile); the first visited tile holds a visible pair."""
    tm, tn = 8, 16
    for Sq, Sk in itertools.product((1, 5, 8, 17, 33, 64), (1, 7, 16, 17, 40, 64)):
        for n in range(-(-Sk // tn)):
            m_min, m_max, m_mask = bm.m_block_range_py(n, Sq, Sk, tm, tn, causal)
            assert 0 <= m_min <= m_mask <= m_max <= -(-Sq // tm), (Sq, Sk, n)
            keys = range(n * tn, (n + 1) * tn)
            for m in range(-(-Sq // tm)):
                rows = range(m * tm, min((m + 1) * tm, Sq))
                vis = [visible(q, k, Sq, Sk, causal) for q in rows for k in keys]
                if not m_min <= m < m_max:
                    assert not any(vis), (Sq, Sk, n, m)
                if m_mask <= m < m_max:
                    assert all(vis), (Sq, Sk, n, m)
            if m_max > m_min:
                rows = range(m_min * tm, min((m_min + 1) * tm, Sq))
                assert any(visible(q, k, Sq, Sk, causal) for q in rows for k in keys), (Sq, Sk, n)




@pytest.mark.parametrize("window", WINDOWS, ids=[f"w{l}_{r}" for l, r in WINDOWS])
def test_m_block_range_window_brute_force(window):
    """Every visible (q, k) of a real row lies in a visited query tile of k's KV tile; tiles outside
    m_min .. m_max - 1 hold none; tiles m_lo .. m_hi - 1 hold only visible pairs (every real row, every
    key of the KV tile); the first and last visited tiles hold a visible pair (of some row of the tile,
    counting the rows past Sq the kernel computes with P = 0)."""
    left, right = window
    tm, tn = 8, 16
    for Sq, Sk in itertools.product((1, 5, 8, 17, 33, 64), (1, 7, 16, 17, 40, 64)):
        for n in range(-(-Sk // tn)):
            m_min, m_max, m_lo, m_hi = bm.m_block_range_window_py(n, Sq, Sk, tm, tn, left, right)
            assert 0 <= m_min <= m_lo <= m_hi <= m_max <= -(-Sq // tm), (Sq, Sk, n)
            keys = range(n * tn, (n + 1) * tn)
            for m in range(-(-Sq // tm)):
                rows = range(m * tm, min((m + 1) * tm, Sq))
                vis = [visible_window(q, k, Sq, Sk, left, right) for q in rows for k in keys]
                if not m_min <= m < m_max:
                    assert not any(vis), (Sq, Sk, n, m)
                if m_lo <= m < m_hi:
                    assert all(vis), (Sq, Sk, n, m)
            for m in ((m_min, m_max - 1) if m_max > m_min else ()):
                assert any(visible_window(q, k, Sq, Sk, left, right) for q in range(m * tm, (m + 1) * tm)
                           for k in keys), (Sq, Sk, n, m)


@pytest.mark.parametrize("window", [None, "causal"] + WINDOWS, ids=lambda w: str(w))
def test_n_block_last_orders_the_turns(window):
    """The deterministic mode's turns: for every query tile, the KV tiles whose ranges hold it are
    consecutive and end at ``n_block_last`` (the last tile for dense ranges), so ``n_block_last -
    n_block`` numbers them 0, 1, ... from the top."""
    tm, tn = 8, 16
    for Sq, Sk in itertools.product((1, 5, 8, 17, 33, 64, 100), (1, 7, 16, 17, 40, 64, 90)):
        holders = {}
        for n in range(-(-Sk // tn)):
            if window is None or window == "causal":
                m_min, m_max, _ = bm.m_block_range_py(n, Sq, Sk, tm, tn, window == "causal")
            else:
                m_min, m_max, _, _ = bm.m_block_range_window_py(n, Sq, Sk, tm, tn, *window)
            for m in range(m_min, m_max):
                holders.setdefault(m, []).append(n)
        right = {None: -1, "causal": 0}.get(window) if not isinstance(window, tuple) else window[1]
        for m, ns in holders.items():
            last = bm.n_block_last_py(m, Sq, Sk, tm, tn, right)
            assert ns == list(range(last - len(ns) + 1, last + 1)), (Sq, Sk, window, m, ns, last)


@pytest.mark.parametrize("num_n,heads,batch,Sq,D", [(1, 1, 1, 17, 128), (32, 32, 4, 4096, 128), (8, 16, 16, 1024, 128),
                                                    (129, 32, 1, 16384, 64), (5, 3, 7, 600, 96), (64, 40, 3, 8192, 256)])
def test_lpt_order_covers_every_tile_once(num_n, heads, batch, Sq, D):
    """``FlashBwdConfig.lpt``'s CTA -> (KV tile, head, batch) map is a bijection of the (num_n, heads, batch)
    grid; each (batch, head) pair's KV tiles start in order from tile 0 (the longest when causal); the first
    CTAs take tile 0 of a whole section (as many heads as fit the L2 budget, or all), the last ones the
    last tile (the shortest)."""
    order = [bc.lpt_tile_coords_py(i, num_n, heads, batch, Sq, D) for i in range(num_n * heads * batch)]
    assert sorted(order) == sorted((n, h, b) for n in range(num_n) for h in range(heads) for b in range(batch))
    for hb in {(h, b) for _, h, b in order}:
        ns = [n for n, h, b in order if (h, b) == hb]
        assert ns == sorted(ns), hb
    assert order[0][0] == 0 and order[-1][0] == num_n - 1
    fit = (40 * 1024 * 1024 // (bc.LPT_TOKEN_BYTES_PER_D * D)) // Sq
    section = max([1] + [p for p in (2, 4, 8, 16, 32, 64) if fit >= p])
    first = order[:min(section, heads * batch)]
    assert all(n == 0 for n, _, _ in first), (section, first)


def test_lpt_config_rules():
    """lpt orders causal, dense, non-deterministic grids only (deterministic turns assume the grid's order)."""
    tile = LB.bwd_tile("bfloat16", 128)
    bk.FlashBwdConfig("bfloat16", 128, True, tile, lpt=True)
    for kw in (dict(causal=False), dict(deterministic=True), dict(varlen=True)):
        args = dict(dtype="bfloat16", head_dim=128, causal=True, tile=tile, lpt=True) | kw
        with pytest.raises(ValueError, match="lpt"):
            bk.FlashBwdConfig(**args)


def test_kv_reduce_config_rules():
    """kv_reduce is for GQA's fp32 accumulators without the deterministic turns (whose ordered adds are
    per thread) and for the 128-key tiles whose K and V buffers hold the two warpgroups' fp32 tiles."""
    tile = LB.bwd_tile("bfloat16", 128)
    bk.FlashBwdConfig("bfloat16", 128, True, tile, kv_reduce=True)
    assert not bk.bwd_config("bfloat16", 128, True).kv_reduce  # not the default until a GPU run measures it
    bad = (dict(direct_kv=True), dict(deterministic=True), dict(head_dim=256, tile=LB.bwd_tile("bfloat16", 256)),
           dict(tile=dataclasses.replace(tile, tile_n=64)))
    for kw in bad:
        args = dict(dtype="bfloat16", head_dim=128, causal=True, tile=tile, kv_reduce=True) | kw
        with pytest.raises(ValueError, match="kv_reduce"):
            bk.FlashBwdConfig(**args)


@pytest.mark.parametrize("D,causal,varlen", [(64, False, False), (96, True, True), (128, True, False)])
def test_kv_reduce_backward_compiles(D, causal, varlen):
    """``FlashBwdConfig.kv_reduce``: no per-thread atomic adds left (the default's GQA epilogue has D of
    them per thread), TMA reduce-adds instead, the same HGMMAs, and at most 3 more local-memory
    instructions than the default (D 64: 9 -> 11)."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", D, causal, varlen=varlen)
    reps = [ins.inspect_builder(bk.backward_builder(c)) for c in (dataclasses.replace(cfg, kv_reduce=True), cfg)]
    (k, sass), (k0, sass0) = ((r.kernels[0], r.sass) for r in reps)
    print(reps[0].summary(), reps[1].summary(), sep="\n")
    assert len(re.findall(r"\bREDG\b", sass0)) == D and not re.findall(r"\bREDG\b", sass)
    assert len(re.findall(r"\bUTMAREDG\b", sass)) > len(re.findall(r"\bUTMAREDG\b", sass0))
    assert k.instructions["HGMMA"] == k0.instructions["HGMMA"]
    assert k.spills <= k0.spills + 3, (reps[0].summary(), reps[1].summary())


def test_dense_rotation_turns_follow_arrival():
    """The deterministic mode on dense ranges: KV tile n walks query tiles from floor(n M / N) on, wrapping,
    when N <= M, else 0, 1, ...; ``dense_turn`` numbers the N KV tiles at each query tile in the order they
    arrive there (step, then KV tile), 0 .. N - 1, and with N <= M consecutive arrivals at a query tile are
    at least floor(M / N) steps apart (nobody queues; a turn has that long to pass on)."""
    tm, tn = 8, 16
    for Sq, Sk in itertools.product((1, 5, 8, 17, 33, 64, 100, 300, 1000), (1, 7, 16, 17, 40, 64, 90, 300)):
        M, N = -(-Sq // tm), -(-Sk // tn)
        arrival = {}
        for n in range(N):
            shift = bm.dense_rotation_py(n, Sq, Sk, tm, tn)
            assert shift == (n * M // N if N <= M else 0)
            for step in range(M):
                arrival.setdefault((shift + step) % M, []).append((step, n))
        for m, who in arrival.items():
            order = [n for _, n in sorted(who)]
            assert [bm.dense_turn_py(n, m, Sq, Sk, tm, tn) for n in order] == list(range(N)), (Sq, Sk, m, order)
            if N <= M:
                steps = sorted(step for step, _ in who)
                assert all(b - a >= M // N for a, b in zip(steps, steps[1:])), (Sq, Sk, m, steps)
            for G in (2, 3):  # BwdTile.dq_groups: each group's members numbered in their arrival order
                for g in range(G):
                    members = [n for n in order if n % G == g]
                    turns = [bm.dense_turn_py(n, m, Sq, Sk, tm, tn, G) for n in members]
                    assert turns == list(range(len(members))), (Sq, Sk, m, G, members, turns)


@pytest.mark.parametrize("causal", [False, True])
def test_window_range_reduces_to_dense(causal):
    """(-1, -1) and (-1, 0) visit the dense ranges' tiles and leave the same ones unmasked (a key-length
    tail's tiles, all masked, are the window's far edge rather than its near one)."""
    for Sq, Sk in itertools.product((1, 17, 33, 64), (1, 8, 17, 64)):
        for n in range(-(-Sk // 16)):
            m_min, m_max, m_mask = bm.m_block_range_py(n, Sq, Sk, 8, 16, causal)
            w_min, w_max, m_lo, m_hi = bm.m_block_range_window_py(n, Sq, Sk, 8, 16, -1, 0 if causal else -1)
            assert (w_min, w_max) == (m_min, m_max) and set(range(m_lo, m_hi)) == set(range(m_mask, m_max))


def emulate_backward(q, k, v, o, do, lse, causal, scale, tm, tn, window=None, softcap=0.0, dlse=None):
    """The kernels' algorithm in float64 for (Sq, Hq, D) / (Sk, Hkv, D) tensors of one batch: the
    pre-pass (Delta = rowsum(dO O) - dLSE, LSE_log2 with +inf for empty and padding rows, padded to
    BWD_ROW_PAD), then per (KV tile, query head) the query tiles of m_block_range with zero-filled rows
    past Sq / Sk, the transposed mask on tiles below m_mask, P^T, dS^T, dV / dK sums, dQ added into the
    padded accumulator; dK / dV summed over each KV head's query heads; the post-pass scales.
    ``window``: (left, right) sides (-1: unbounded), the window walk (masked, unmasked, masked far
    edge).  ``softcap``: the kernel's softcapping (t = tanh(S^T scale / softcap) before the mask, P^T
    from t with ``scale_log2 = softcap log2(e)``, dS^T times ``1 - t^2`` clamped at 0).  Returns
    ``(dq, dk, dv, delta)``, delta (Hq, Sq) the pre-pass's rows (the sink's gradient reads them)."""
    Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[:2]
    G = Hq // Hkv
    Sp = -(-Sq // LB.BWD_ROW_PAD) * LB.BWD_ROW_PAD
    delta = torch.zeros(Hq, Sp, dtype=torch.float64)
    lse2 = torch.full((Hq, Sp), math.inf, dtype=torch.float64)
    delta[:, :Sq] = (do.double() * o.double()).sum(-1).T
    if dlse is not None:
        delta[:, :Sq] -= dlse.double()
    l = lse.double()
    lse2[:, :Sq] = torch.where(torch.isneginf(l), torch.full_like(l, math.inf), l * math.log2(math.e))
    dq_acc = torch.zeros(Hq, Sp, D, dtype=torch.float64)
    dk_acc = torch.zeros(Sk, Hkv, D, dtype=torch.float64)
    dv_acc = torch.zeros(Sk, Hkv, D, dtype=torch.float64)
    scale_log2 = (softcap if softcap else scale) * math.log2(math.e)

    def rows(x, r0, n):
        t = torch.zeros(n, D, dtype=torch.float64)
        cnt = max(0, min(n, x.shape[0] - r0))
        t[:cnt] = x[r0:r0 + cnt].double()
        return t

    for h in range(Hq):
        hk = h // G
        for n in range(-(-Sk // tn)):
            kt, vt = rows(k[:, hk], n * tn, tn), rows(v[:, hk], n * tn, tn)
            if window is None:
                m_min, m_max, m_lo = bm.m_block_range_py(n, Sq, Sk, tm, tn, causal)
                m_hi = m_max
            else:
                m_min, m_max, m_lo, m_hi = bm.m_block_range_window_py(n, Sq, Sk, tm, tn, *window)
            dk_t = torch.zeros(tn, D, dtype=torch.float64)
            dv_t = torch.zeros(tn, D, dtype=torch.float64)
            for m in range(m_min, m_max):
                qt, dot = rows(q[:, h], m * tm, tm), rows(do[:, h], m * tm, tm)
                st = kt @ qt.T  # (keys, queries)
                if softcap:
                    st = torch.tanh(st * (scale / softcap))
                if not m_lo <= m < m_hi:
                    key = n * tn + torch.arange(tn)[:, None]
                    pos = m * tm + torch.arange(tm)[None, :] + Sk - Sq
                    vis = key < Sk
                    if window is not None:
                        if window[0] >= 0:
                            vis = vis & (key >= pos - window[0])
                        if window[1] >= 0:
                            vis = vis & (key <= pos + window[1])
                    elif causal:
                        vis = vis & (key <= pos)
                    st = st.masked_fill(~vis, -math.inf)
                pt = torch.exp2(st * scale_log2 - lse2[h, m * tm:(m + 1) * tm][None, :])
                dpt = vt @ dot.T
                pd = pt * (1 - st * st).clamp_min(0) if softcap else pt  # softcap: P^T (1 - t^2)
                dst = pd * (dpt - delta[h, m * tm:(m + 1) * tm][None, :])
                dv_t += pt @ dot
                dk_t += dst @ qt
                dq_acc[h, m * tm:(m + 1) * tm] += dst.T @ kt
            cnt = min(tn, Sk - n * tn)
            dk_acc[n * tn:n * tn + cnt, hk] += dk_t[:cnt]
            dv_acc[n * tn:n * tn + cnt, hk] += dv_t[:cnt]
    return (dq_acc[:, :Sq].permute(1, 0, 2) * scale, dk_acc * scale, dv_acc, delta[:, :Sq])


def reference_grads(q, k, v, do, causal, scale, window=None, softcap=0.0, sink=None, dlse=None):
    """float64 autograd of masked attention; rows that see no key give 0; also returns out and LSE.
    ``softcap``: scores ``softcap * tanh(s / softcap)`` before the mask; ``sink`` (Hq,): one more logit
    in every row's denominator (a row without keys: O = 0, LSE = sink), its gradient last; ``dlse``
    (Hq, Sq): the LSE's gradient."""
    G = q.shape[1] // k.shape[1]
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    sk = None if sink is None else sink.double().requires_grad_()
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    Sq, Sk = q.shape[0], k.shape[0]
    if causal or window is not None:
        vis = torch.tensor([[visible_window(i, j, Sq, Sk, *(window or (-1, 0))) for j in range(Sk)]
                            for i in range(Sq)])
        s = s.masked_fill(~vis, -math.inf)
    full = s if sk is None else torch.cat([s, sk[:, None, None].expand(-1, Sq, 1)], -1)
    lse = torch.logsumexp(full, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    o = torch.einsum("hqk,khd->qhd", p, vv)
    loss = (o * do.double()).sum()
    if dlse is not None:
        loss = loss + (lse.nan_to_num(0.0, neginf=0.0) * dlse.double()).sum()
    loss.backward()
    res = (o.detach(), lse.detach(), q.grad, k.grad, v.grad)
    return res if sk is None else res + (sk.grad,)


def check_emulation(Sq, Sk, Hq, Hkv, causal, window, seed, softcap=0.0, sink=False, dlse=False, tn=128):
    """Emulated kernels (64 x ``tn`` tiles, D = 16) vs float64 autograd, every gradient finite; with
    ``sink``, the host's sink gradient (:func:`~cute_kernels.attention.backward.sink_grad`) from the
    emulated pre-pass's Delta too."""
    from cute_kernels.attention.backward import sink_grad

    g = torch.Generator().manual_seed(seed)
    D = 16
    q, do = (torch.randn(Sq, Hq, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(Sk, Hkv, D, generator=g, dtype=torch.float64) for _ in range(2))
    sk = torch.randn(Hq, generator=g, dtype=torch.float64) + 1.0 if sink else None
    dl = torch.randn(Hq, Sq, generator=g, dtype=torch.float64) if dlse else None
    scale = D ** -0.5
    o, lse, dq_ref, dk_ref, dv_ref, *dsink_ref = reference_grads(q, k, v, do, causal, scale, window, softcap, sk, dl)
    dq, dk, dv, delta = emulate_backward(q, k, v, o, do, lse, causal, scale, 64, tn, window, softcap, dl)
    pairs = [(dq, dq_ref), (dk, dk_ref), (dv, dv_ref)]
    if sink:
        pairs.append((sink_grad(sk, lse[None], delta[None]), dsink_ref[0]))
    for got, ref in pairs:
        assert torch.isfinite(got).all()
        assert torch.allclose(got, ref, atol=1e-10), (got - ref).abs().max()


@pytest.mark.parametrize("tn", [128, 64], ids=["tile_n128", "tile_n64"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk,Hq,Hkv", [(1, 1, 1, 1), (17, 130, 2, 1), (130, 17, 4, 2), (70, 70, 2, 2),
                                          (200, 77, 1, 1), (5, 300, 3, 1)])
def test_emulated_backward_matches_autograd(causal, Sq, Sk, Hq, Hkv, tn):
    """The tile algorithm, emulated at the real tile sizes (64 x 128; 64 x 64 of D = 256), equals
    autograd, including rows that see no key (causal, Sq > Sk: zero gradients) and GQA sums."""
    check_emulation(Sq, Sk, Hq, Hkv, causal, None, 0, tn=tn)


@pytest.mark.parametrize("softcap,sink,dlse", [(5.0, False, False), (0.0, True, False), (0.0, True, True),
                                               (2.0, True, True)], ids=["softcap", "sink", "sink-dlse", "both-dlse"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk,Hq,Hkv", [(17, 130, 2, 1), (130, 17, 4, 2), (200, 77, 1, 1)])
def test_emulated_variant_backward_matches_autograd(Sq, Sk, Hq, Hkv, causal, softcap, sink, dlse):
    """Softcapping (P from the capped scores, dS times 1 - tanh^2, masked scores 0 without NaN) and
    sinks (the sink-inclusive LSE, Delta unchanged; the sink's gradient -sum exp(sink - lse) Delta with
    Delta = rowsum(dO O) - dLSE) equal float64 autograd, rows that see no key included (causal, Sq > Sk:
    lse = sink there, d sink = dLSE)."""
    check_emulation(Sq, Sk, Hq, Hkv, causal, None, 2, softcap, sink, dlse)


@pytest.mark.parametrize("window", [(0, 0), (5, 0), (0, 7), (40, 3), (130, 130), (300, -1), (-1, 200)],
                         ids=lambda w: f"w{w[0]}_{w[1]}")
@pytest.mark.parametrize("Sq,Sk,Hq,Hkv", [(17, 300, 2, 1), (300, 17, 2, 2), (200, 200, 4, 2), (333, 257, 1, 1)])
@pytest.mark.parametrize("tn", [128, 64], ids=["tile_n128", "tile_n64"])
def test_emulated_window_backward_matches_autograd(window, Sq, Sk, Hq, Hkv, tn):
    """The window walk (masked near edge, unmasked, masked far edge) equals autograd of windowed
    attention, rows that see no key included."""
    check_emulation(Sq, Sk, Hq, Hkv, False, window, 1, tn=tn)


# ------------------------------------------------------------------------------------------ compile
def _assert_spill_budget(k, t, summary, varlen=False):
    """No local memory, except the 128-row D = 64 tile's: ptxas keeps a few loop-invariant values (the
    dQ tile's shared-memory addresses) in local memory, at most three L1-resident loads per query tile
    (6 local-memory instructions in all; 12 with GQA's epilogue, 13 since the causal mask's keep-bits:
    one more load per masked tile, against 122 fewer instructions there); measured with them, the tile's
    main kernel is 1.08-1.10x the 64-row one's on the H200 (2026-12-03, ``profiles/ab_backward.py``);
    packed sequences two more (the sequence's lengths, loaded values where the dense kernel re-reads its
    parameters).  Any further spill fails."""
    budget = (13 + 2 * varlen, 24) if t.tile_m == 128 else (0, 0)
    assert k.spills <= budget[0] and k.stack_frame <= budget[1], summary


def _sass_counts(rep):
    return collections.Counter(re.findall(r"\b(REDG|ATOMG|STG|LDG)[A-Z0-9._]*", rep.sass))


def _per_thread(t, rows, cols):
    """Values of a (rows, cols) accumulator per consumer thread: a warpgroup's 64 keys by ``cols`` over
    its 128 threads, or, head dims split (D 256), the whole tile over both warpgroups' 256 threads."""
    return rows * cols // (128 * t.consumer_warpgroups) if t.kv_split_d else 64 * cols // 128


@pytest.mark.parametrize("dtype,head_dim,causal", CONFIGS)
def test_backward_compiles_within_spill_budget(dtype, head_dim, causal):
    """One kernel, no local memory or stack, the wgmma bodies of the masked and the unmasked query-tile
    loops (S^T, dP^T: D/16 k-blocks each; dV, dK: tile_m/16; dQ: tile_n/16), every operand loaded by
    TMA (no LDG), dQ added by TMA reduce-adds (no per-thread reduction in the loop bodies) and dK / dV
    stored by TMA from shared memory (one query head per KV head: no per-thread global access at all)."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config(dtype, head_dim, causal, direct_kv=True)
    t = cfg.tile
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    print(f"D={head_dim} causal={causal} {dtype}: {rep.summary()}")
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    _assert_spill_budget(k, t, rep.summary())
    assert k.instructions["HGMMA"] == 2 * (2 * head_dim // 16 + 2 * t.tile_m // 16 + t.tile_n // 16), rep.summary()
    assert k.instructions["UTMALDG"] > 0 and k.instructions["STSM"] > 0, rep.summary()
    ops = _sass_counts(rep)
    assert ops["LDG"] == 0, ops
    assert ops["REDG"] == 0 and ops["STG"] == 0, ops
    assert k.instructions["UTMAREDG"] > 0 and k.instructions["UTMASTG"] > 0, rep.summary()


@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("kv", ["direct", "gqa"])
def test_varlen_backward_compiles_within_spill_budget(head_dim, kv):
    """Packed sequences: the dense kernel's wgmma bodies and TMA traffic; each CTA reads its sequence's
    bounds (a few LDG of cu_seqlens); the partial last KV tile's dK / dV by per-thread stores (direct) or
    the GQA adds; the spill budget of the dense configs."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", head_dim, kv == "direct", direct_kv=kv == "direct", varlen=True)
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    print(f"D={head_dim} {kv} varlen: {rep.summary()}")
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    _assert_spill_budget(k, cfg.tile, rep.summary(), varlen=True)
    t = cfg.tile
    assert k.instructions["HGMMA"] == 2 * (2 * head_dim // 16 + 2 * t.tile_m // 16 + t.tile_n // 16), rep.summary()
    ops = _sass_counts(rep)
    assert 0 < ops["LDG"] <= 8, ops  # cu_seqlens only: every operand comes by TMA
    if kv == "direct":
        assert ops["STG"] > 0 and k.instructions["UTMASTG"] > 0 and ops["REDG"] == 0, ops
    else:
        assert ops["REDG"] > 0 and ops["STG"] == 0, ops


@pytest.mark.parametrize("kind", ["prepass", "convert"])
def test_varlen_prepost_compile(kind):
    """The packed pre- and post-pass: no local memory, vector row loads."""
    from cute_kernels.attention import backward_prepost as bp
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(bp.prepost_builder(bp.BwdPrepostConfig(kind, "bfloat16", 96, kind == "prepass",
                                                                     varlen=True)))
    k = rep.kernels[0]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    assert re.findall(r"\bLDG\.E\.(?:64|128)\b", rep.sass), rep.summary()


@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
def test_gqa_backward_compiles_within_spill_budget(head_dim):
    """GQA: dK / dV rows added into the fp32 accumulators (per-thread reductions, no stores)."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", head_dim, True, direct_kv=False)
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    print(f"D={head_dim} gqa: {rep.summary()}")
    k = rep.kernels[0]
    _assert_spill_budget(k, cfg.tile, rep.summary())
    ops = _sass_counts(rep)
    assert ops["REDG"] == 2 * _per_thread(cfg.tile, cfg.tile.tile_n, head_dim), ops
    assert ops["STG"] == 0 and ops["LDG"] == 0, ops


@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
def test_window_backward_compiles_within_spill_budget(head_dim):
    """A window config: the far-edge loop adds a third body (masked); otherwise as the dense ones."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", head_dim, False, window=True)
    t = cfg.tile
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    print(f"D={head_dim} window: {rep.summary()}")
    k = rep.kernels[0]
    _assert_spill_budget(k, t, rep.summary())
    assert k.instructions["HGMMA"] == 3 * (2 * head_dim // 16 + 2 * t.tile_m // 16 + t.tile_n // 16), rep.summary()
    assert _sass_counts(rep)["LDG"] == 0


@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("kv", ["direct", "gqa"])
def test_softcap_backward_compiles_without_spills(kv, head_dim):
    """Softcapping (causal, bf16): the 64-row tile at every head dim (D 64's 128-row one spilled 45
    values: S^T, dP^T, dK and dV already take 192 registers there), no local memory, the same wgmma
    bodies and global accesses as the plain kernel of the same tile, and one more MUFU (the tanh) per
    score of the masked and the unmasked loop bodies: P^T in 16 bits and ``P^T (1 - t^2)`` in fp32 take
    the registers P^T did."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", head_dim, True, direct_kv=kv == "direct", softcap=True)
    t = cfg.tile
    assert t.tile_m == 64 and cfg.variant_args == ("softcap_scale",)
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    plain = bk.FlashBwdConfig(cfg.dtype, head_dim, True, t, direct_kv=cfg.direct_kv)
    rep0 = ins.inspect_builder(bk.backward_builder(plain))
    print(f"D={head_dim} {kv} softcap: {rep.summary()}\n  plain, same tile: {rep0.summary()}")
    k, k0 = rep.kernels[0], rep0.kernels[0]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    assert k.instructions["HGMMA"] == k0.instructions["HGMMA"] == 2 * (2 * head_dim // 16 + 2 * t.tile_m // 16
                                                                        + t.tile_n // 16), rep.summary()
    assert k.instructions["MUFU"] - k0.instructions["MUFU"] == 2 * _per_thread(t, t.tile_n, t.tile_m), (
        rep.summary(), rep0.summary())
    assert _sass_counts(rep) == _sass_counts(rep0)


def test_softcap_window_backward_compiles_without_spills():
    """Softcapping with a window (three loop bodies), D 64 (the tightest registers): no local memory."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", 64, False, window=True, direct_kv=False, softcap=True)
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    print(f"D=64 window gqa softcap: {rep.summary()}")
    k = rep.kernels[0]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    assert k.instructions["HGMMA"] == 3 * (2 * 64 // 16 + 2 * 64 // 16 + 128 // 16), rep.summary()


def _compile_tile_variant(variant: str, **fields):
    """``variant`` = ``kind-D[-causal]`` (kind: direct, gqa, window, softcap, deterministic, varlen, carry --
    dk_carry on both sides): the planned configuration and the same with ``fields`` set on its tile, compiled;
    ``(rep, rep0, count)`` with ``count(rep, opcode)`` the SASS occurrences.  The HGMMAs must be the same."""
    from cute_kernels.tools import inspect as ins

    parts = variant.split("-")
    kind = parts[0]
    cfg = bk.bwd_config("bfloat16", int(parts[1]), "causal" in parts, window=kind == "window", direct_kv=kind != "gqa",
                        softcap=kind == "softcap", deterministic=kind == "deterministic", varlen=kind == "varlen")
    if kind == "carry":
        cfg = dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dk_carry=True))
    changed = dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, **fields))
    rep, rep0 = (ins.inspect_builder(bk.backward_builder(c)) for c in (changed, cfg))
    print(f"{variant} {fields}: {rep.summary()}\n  default: {rep0.summary()}")
    assert rep.kernels[0].instructions["HGMMA"] == rep0.kernels[0].instructions["HGMMA"], (rep.summary(),
                                                                                            rep0.summary())
    return rep, rep0, lambda r, op: len(re.findall(rf"\b{re.escape(op)}\b", r.sass))


@pytest.mark.parametrize("variant", ["direct-64", "direct-96", "direct-128-causal", "gqa-128", "window-128",
                                     "softcap-64", "deterministic-128", "varlen-128-causal"])
def test_dk_carry_backward_compiles(variant):
    """``BwdTile.dk_carry`` (dK += dS^T Q from shared memory, running on into the next query tile): the
    default's HGMMAs, no more wgmma waits or arrives than it (ptxas serializes every wgmma when it cannot
    keep one in flight across the loop: 64 ARRIVE / DEPBAR then, as the register-operand form did), and
    no more local-memory traffic (the register dS^T no longer lives past the dQ wgmma)."""
    rep, rep0, count = _compile_tile_variant(variant, dk_carry=True)
    k, k0 = rep.kernels[0], rep0.kernels[0]
    for op in ("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE"):
        assert count(rep, op) <= count(rep0, op), (op, count(rep, op), count(rep0, op))
    assert k.spills <= k0.spills and k.stack_frame <= k0.stack_frame, (rep.summary(), rep0.summary())


def test_dk_carry_tile_rules():
    assert not LB.bwd_tile("bfloat16", 128).dk_carry  # not the default until a GPU run measures it
    with pytest.raises(ValueError, match="dk_carry"):
        dataclasses.replace(LB.bwd_tile("bfloat16", 256), dk_carry=True)


@pytest.mark.parametrize("variant", ["direct-96", "direct-128-causal", "gqa-128", "gqa-96-causal",
                                     "carry-128-causal"])
def test_dv_early_backward_compiles(variant):
    """``BwdTile.dv_early`` (dV += P^T dO issued before the dP^T wait): the default's HGMMAs, at most one
    more wgmma fence and wait per step (its own commit, and the fence dK's register operand then needs),
    and at most 4 local-memory instructions (2 loop-invariant values reloaded per query tile at D 128
    causal; none elsewhere).  Windows (16 at D 128) and D 64's 128-row tile (42-50) spill more: the
    variant is a candidate for the plain D 96 / 128 configurations only."""
    from cute_kernels.tools.inspect import exp2_under_gemm, wgmma_loop_bodies

    rep, rep0, count = _compile_tile_variant(variant, dv_early=True)
    for op in ("WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE"):  # (per masked and unmasked query-tile loop)
        assert count(rep, op) <= count(rep0, op) + 2, (op, count(rep, op), count(rep0, op))
    assert rep.kernels[0].spills <= 4 and rep.kernels[0].stack_frame <= 8, rep.summary()
    # what it is for: every exponential of the step scheduled while dP^T is in flight (ptxas put the
    # default's dP^T wait after the first one: 1 of 32)
    overlaps = [exp2_under_gemm(body) for body in wgmma_loop_bodies(rep.sass)]
    assert overlaps and all(o is not None and o[1] == o[2] > 0 for o in overlaps), overlaps


@pytest.mark.parametrize("variant", ["direct-64-causal", "direct-96", "direct-128-causal", "gqa-128", "window-128",
                                     "varlen-128-causal", "deterministic-128"])
def test_qdo_rings_backward_compiles(variant):
    """``BwdTile.qdo_rings`` (Q + LSE and dO + Delta in rings of their own): the default's HGMMAs and no more
    local-memory traffic than the default (D 64's 128-row tile: 2 local-memory instructions against 8)."""
    rep, rep0, _ = _compile_tile_variant(variant, qdo_rings=True)
    k, k0 = rep.kernels[0], rep0.kernels[0]
    assert k.spills <= k0.spills and k.stack_frame <= k0.stack_frame, (rep.summary(), rep0.summary())


def test_dv_early_tile_rules():
    assert not LB.bwd_tile("bfloat16", 128).dv_early  # not the default until a GPU run measures it
    with pytest.raises(ValueError, match="dv_early"):
        dataclasses.replace(LB.bwd_tile("bfloat16", 256), dv_early=True)
    assert not LB.bwd_tile("bfloat16", 128).qdo_rings
    for bad in (dict(head_dim=256), dict(dk_carry=True)):
        with pytest.raises(ValueError, match="qdo_rings"):
            t = LB.bwd_tile("bfloat16", bad.get("head_dim", 128))
            dataclasses.replace(t, qdo_rings=True, dk_carry=bad.get("dk_carry", False))


@pytest.mark.parametrize("kv,window", [("gqa", True), ("direct", False)])
def test_deterministic_backward_compiles_like_the_default(kv, window):
    """Deterministic mode (D 128): the default kernel's wgmma bodies and spill budget, two spin loops of
    acquire loads (the dQ warp's turn; with GQA the dK / dV turn), two more named barriers with GQA (around
    the ordered adds); its semaphores are the entries' trailing arguments."""
    from cute_kernels.tools import inspect as ins

    cfg = bk.bwd_config("bfloat16", 128, not window, window=window, direct_kv=kv == "direct", deterministic=True)
    assert cfg.variant_args == ("dq_semaphore",) + (("dkv_semaphore",) if kv == "gqa" else ())
    rep = ins.inspect_builder(bk.backward_builder(cfg))
    rep0 = ins.inspect_builder(bk.backward_builder(dataclasses.replace(cfg, deterministic=False)))
    print(f"D=128 {kv} window={window} deterministic: {rep.summary()}\n  default: {rep0.summary()}")
    k, k0 = rep.kernels[0], rep0.kernels[0]
    assert k.spills == k0.spills == 0 and k.stack_frame == 0, rep.summary()
    assert k.instructions["HGMMA"] == k0.instructions["HGMMA"] and k.instructions["UTMAREDG"] == k0.instructions["UTMAREDG"]
    acquire = re.findall(r"\bLDG\.E\.STRONG\.GPU\b", rep.sass)
    assert len(acquire) >= (4 if kv == "gqa" else 2) and not re.findall(r"\bLDG\b", rep0.sass), rep.summary()
    assert k.instructions["BAR"] >= k0.instructions["BAR"] + (2 if kv == "gqa" else 0), (rep.summary(), rep0.summary())


@pytest.mark.parametrize("variant", ["direct-128", "gqa-96-causal", "split-256-causal", "window-128", "varlen-64"])
def test_dq_warps_2_backward_compiles(variant):
    """``BwdTile.dq_warps = 2`` (deterministic: two dQ warps take the query tiles by parity): the one-warp
    kernel's wgmma bodies and spill budget; its reduce-adds, turn spins and dQ barrier arrives twice over
    (each warp's own code); the default tile keeps one warp."""
    from cute_kernels.tools import inspect as ins

    parts = variant.split("-")
    D = int(parts[1])
    cfg = bk.bwd_config("bfloat16", D, "causal" in parts, window=parts[0] == "window", direct_kv=parts[0] != "gqa",
                        deterministic=True, varlen=parts[0] == "varlen")
    assert cfg.tile.dq_warps == 1
    two = dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, dq_warps=2))
    rep, rep0 = (ins.inspect_builder(bk.backward_builder(c)) for c in (two, cfg))
    print(f"{variant} dq_warps 2: {rep.summary()}\n  one warp: {rep0.summary()}")
    k, k0 = rep.kernels[0], rep0.kernels[0]
    assert k.instructions["HGMMA"] == k0.instructions["HGMMA"], (rep.summary(), rep0.summary())
    assert k.spills <= k0.spills and k.stack_frame <= k0.stack_frame, (rep.summary(), rep0.summary())
    assert k.instructions["UTMAREDG"] == 2 * k0.instructions["UTMAREDG"], (rep.summary(), rep0.summary())
    spins = lambda r: len(re.findall(r"\bLDG\.E\.STRONG\.GPU\b", r.sass))  # noqa: E731
    assert spins(rep) > spins(rep0), (spins(rep), spins(rep0))
    with pytest.raises(ValueError, match="dq_warps"):
        dataclasses.replace(cfg.tile, dq_warps=3)


def test_dq_groups_plan_and_post_pass():
    """``BwdTile.dq_groups = 2``: the plan's dQ post-pass sums two accumulators (twice the loads of the
    one-accumulator pass, one store per element as before); with GQA a one-accumulator pass converts dK /
    dV; the default mode keeps one accumulator whatever the tile says; the main kernel compiles with the
    two warps and no more spills than with one accumulator."""
    from cute_kernels.attention import backward as BW
    from cute_kernels.attention import backward_prepost as bp
    from cute_kernels.tools import inspect as ins

    det = bk.bwd_config("bfloat16", 256, False, direct_kv=False, deterministic=True)
    tile2 = dataclasses.replace(det.tile, dq_warps=2, dq_groups=2)
    plan = BW.plan_around(dataclasses.replace(det, tile=tile2))
    assert [c.groups for c in plan[1:]] == [1, 2, 1] and plan[3].kind == "convert" and not plan[3].varlen
    direct = BW.plan_around(dataclasses.replace(det, tile=tile2, direct_kv=True))
    assert len(direct) == 3 and direct[2].groups == 2
    plain = BW.plan_around(dataclasses.replace(det, tile=tile2, deterministic=False))
    assert len(plain) == 3 and plain[2].groups == 1
    with pytest.raises(ValueError, match="groups"):
        bp.BwdPrepostConfig("prepass", "bfloat16", 128, groups=2)
    one, two = (ins.inspect_builder(bp.prepost_builder(bp.BwdPrepostConfig("convert", "bfloat16", 128, groups=g)))
                for g in (1, 2))
    assert two.kernels[0].instructions["LDG"] == 2 * one.kernels[0].instructions["LDG"], (one.summary(), two.summary())
    assert two.kernels[0].instructions["STG"] == one.kernels[0].instructions["STG"]
    rep, rep0 = (ins.inspect_builder(bk.backward_builder(dataclasses.replace(det, tile=t)))
                 for t in (tile2, dataclasses.replace(tile2, dq_groups=1)))
    k, k0 = rep.kernels[0], rep0.kernels[0]
    assert k.instructions["HGMMA"] == k0.instructions["HGMMA"] and k.spills <= k0.spills, (rep.summary(), rep0.summary())


def test_deterministic_plan_and_warmup():
    """``bwd_plan``'s deterministic key reaches the main kernel only; the warmup spec takes it (a bool)."""
    import cute_kernels
    from cute_kernels.attention import backward as BW
    from cute_kernels.common import jit

    main, pre, post = BW.bwd_plan(torch.bfloat16, 128, True, gqa=True, deterministic=True)
    plain = BW.bwd_plan(torch.bfloat16, 128, True, gqa=True)
    assert main.deterministic and not plain[0].deterministic and (pre, post) == plain[1:]
    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("flash_attn_backward", dict(causal=True, gqa=True, deterministic=True))]) == 1
    assert [c for _, c in dry.seen] == [main, pre, post]
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        cute_kernels.warmup([("flash_attn_backward", dict(deterministic=1))])


@pytest.mark.parametrize("head_dim", LB.BWD_HEAD_DIMS)
@pytest.mark.parametrize("kind,has_dlse", [("prepass", False), ("prepass", True), ("convert", False)])
def test_prepost_compile(kind, has_dlse, head_dim):
    """The pre- and post-pass kernels compile with no local memory; their row loads are vectors."""
    from cute_kernels.attention import backward_prepost as bp
    from cute_kernels.tools import inspect as ins

    rep = ins.inspect_builder(bp.prepost_builder(bp.BwdPrepostConfig(kind, "bfloat16", head_dim, has_dlse)))
    print(f"{kind} dlse={has_dlse} D={head_dim}: {rep.summary()}")
    assert len(rep.kernels) == 1
    k = rep.kernels[0]
    assert k.spills == 0 and k.stack_frame == 0, rep.summary()
    vec = re.findall(r"\bLDG\.E\.(?:64|128)\b", rep.sass)
    assert vec, rep.summary()


def test_config_rules():
    with pytest.raises(ValueError, match="does not match"):
        bk.FlashBwdConfig("bfloat16", 128, False, LB.bwd_tile("bfloat16", 64))
    from cute_kernels.attention import backward_prepost as bp

    with pytest.raises(ValueError):
        bp.BwdPrepostConfig("middle", "bfloat16", 128)
    assert bk.bwd_config("bfloat16", 128, True) != bk.bwd_config("bfloat16", 128, False)
    with pytest.raises(ValueError, match="folds causal"):
        bk.bwd_config("bfloat16", 128, True, window=True)
    with pytest.raises(ValueError, match="mma_only"):
        bk.FlashBwdConfig("bfloat16", 128, False, LB.bwd_tile("bfloat16", 128), mma_only=True, softcap=True)
    # softcapping: its own configuration (a trailing softcap_scale), 64-row tiles at D 64 too
    assert bk.bwd_config("bfloat16", 64, True, softcap=True) != bk.bwd_config("bfloat16", 64, True)
    assert bk.bwd_config("bfloat16", 64, True).tile.tile_m == 128
    assert bk.bwd_config("bfloat16", 64, True, softcap=True).tile.tile_m == 64
    assert bk.bwd_config("bfloat16", 128, True).variant_args == ()


def test_bwd_plan_and_warmup_softcap():
    """``bwd_plan``'s softcap key reaches the main kernel only (the pre- and post-pass are shared), the
    warmup spec takes ``softcap`` (a bool), and sinks compile nothing of their own."""
    import cute_kernels
    from cute_kernels.attention import backward as BW
    from cute_kernels.common import jit

    main, pre, post = BW.bwd_plan(torch.bfloat16, 96, True, True, softcap=True)
    plain = BW.bwd_plan(torch.bfloat16, 96, True, True)
    assert main.softcap and not plain[0].softcap and (pre, post) == plain[1:]
    with jit.dry_run() as dry:
        assert cute_kernels.warmup([("flash_attn_backward", dict(head_dim=96, causal=True, dlse=True,
                                                                 softcap=True))]) == 1
    assert [c for _, c in dry.seen] == [main, pre, post]
    with pytest.raises(TypeError, match="softcap must be a bool"):
        cute_kernels.warmup([("flash_attn_backward", dict(softcap=30.0))])
    with pytest.raises(ValueError, match="unknown keys"):
        cute_kernels.warmup([("flash_attn_backward", dict(sink=True))])


@pytest.mark.parametrize("varlen", [False, True])
def test_prepost_entries_take_their_call_arguments(varlen):
    """The compiled pre- / post-pass accept exactly the arguments :func:`.backward.flash_attn_backward`
    passes (dense: no packed arguments; packed: cu_seqlens_q and max_seqlen_q): called with CPU tensors
    they stop at the device check, not at the argument count."""
    import cutlass.cute as cute

    from cute_kernels.attention import backward_prepost as bp

    f32 = dict(dtype=torch.float32)
    packed = (torch.zeros(3, dtype=torch.int32), 4) if varlen else ()
    pre_args = ((torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16),) * 2 + (torch.zeros(1, 2, 8, **f32),) * 2
                + (torch.zeros(1, 2, 128, **f32),) * 2 + (torch.zeros(1, 2, 128, 64, **f32),) + packed)
    post_args = (torch.zeros(1, 128 if varlen else 8, 2, 64, **f32), torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16),
                 1.0) + packed
    for kind, args in (("prepass", pre_args), ("convert", post_args)):
        k, fake = bp.prepost_builder(bp.BwdPrepostConfig(kind, "bfloat16", 64, varlen=varlen))()
        fn = cute.compile(k, *fake, options="--enable-tvm-ffi")
        with pytest.raises(ValueError, match="Mismatched Tensor on argument #0"):
            fn(*args)

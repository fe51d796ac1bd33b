"""The float32 torch reference of :func:`cute_kernels.attention.decode.decode_attn` (its CPU path and
the tests' ground truth), treating bad device values as the kernel does."""

from __future__ import annotations

import torch

from . import decode_plan as _plan_mod


def decode_attn_reference(
    q, k_cache, v_cache, cache_seqlens, block_table=None, causal=True, softmax_scale=None, softcap=0.0,
    learnable_sink=None, window_size=(-1, -1), cache_leftpad=None,
):
    """Float32 torch reference (the CPU path; one sequence at a time, lengths read on the host): out
    (B, Sq, Hq, D) and the natural-log lse (B, Hq, Sq); rows that see no key get 0 and -inf (with a
    sink: 0 and the sink).  ``softcap`` (0: off), ``learnable_sink``, ``window_size`` and
    ``cache_leftpad`` as :func:`decode_attn`.  Bad device values are treated as the kernel treats them:
    lengths clamped to [0, capacity], left paddings to [0, length], page ids to [0, num_pages).  Only
    the visible keys ``[max(leftpad, L - Sq - window_left), L)`` are read (as the kernel: what lies
    below, a padding or freed pages, may hold anything)."""
    B, Sq, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(B, Sq, Hq, D, dtype=torch.float32, device=q.device)
    lse = torch.full((B, Hq, Sq), float("-inf"), dtype=torch.float32, device=q.device)
    sink = None
    if learnable_sink is not None:  # (Hq,) -> (Hkv, G, 1, 1), the scores' (head group, row) layout
        sink = learnable_sink.to(device=q.device, dtype=torch.float32).view(Hkv, G, 1, 1)
        lse[:] = learnable_sink.to(device=q.device, dtype=torch.float32)[None, :, None]
    lens = cache_seqlens.to("cpu", torch.int64).tolist()
    pads = [0] * B if cache_leftpad is None else cache_leftpad.to("cpu", torch.int64).tolist()
    causal, window = _plan_mod.check_window(window_size, causal)
    left, right = window if window is not None else (-1, 0 if causal else -1)
    cap = _plan_mod.capacity(k_cache, block_table)
    for b in range(B):
        L = max(min(int(lens[b]), cap), 0)  # as the kernel: lengths clamped to [0, capacity]
        lp = min(max(int(pads[b]), 0), L)  # and left paddings to [0, length]
        k_lo = lp if left < 0 else max(lp, L - Sq - left)  # the first key any row sees
        if L - k_lo <= 0:
            continue
        if block_table is None:
            kb, vb = k_cache[b, k_lo:L], v_cache[b, k_lo:L]
        else:
            ps = k_cache.shape[1]
            # as the kernel: page ids clamped to [0, num_pages) (-1 reads page 0, never the last)
            if k_lo == 0:
                pages = block_table[b, : -(-L // ps)].long().clamp(0, k_cache.shape[0] - 1)
                kb = k_cache[pages].reshape(-1, Hkv, D)[:L]
                vb = v_cache[pages].reshape(-1, Hkv, D)[:L]
            else:
                at = torch.arange(k_lo, L, device=block_table.device)
                pages = block_table[b, at // ps].long().clamp(0, k_cache.shape[0] - 1).to(k_cache.device)
                kb = k_cache[pages, (at % ps).to(k_cache.device)]
                vb = v_cache[pages, (at % ps).to(k_cache.device)]
        qb = q[b].float().view(Sq, Hkv, G, D)
        s = torch.einsum("tkgd,lkd->kgtl", qb, kb.float()) * scale  # (Hkv, G, Sq, L - k_lo)
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        pos = torch.arange(k_lo, L, device=q.device)  # cache positions of the keys read
        row = L - Sq + torch.arange(Sq, device=q.device)  # (Sq,): the new tokens' positions (bottom-right)
        if right >= 0:
            s = s.masked_fill(pos[None, None, None, :] > (row + right)[None, None, :, None], float("-inf"))
        lo = torch.full_like(row, lp) if left < 0 else torch.clamp(row - left, min=lp)
        if left >= 0 or lp > 0:
            s = s.masked_fill(pos[None, None, None, :] < lo[None, None, :, None], float("-inf"))
        m = s.amax(-1, keepdim=True)
        if sink is not None:
            m = torch.maximum(m, sink.expand_as(m))
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        if sink is not None:  # the sink joins the denominator only
            l = l + torch.exp(sink - m)
        p = p / torch.where(l > 0, l, torch.ones_like(l))
        o = torch.einsum("kgtl,lkd->tkgd", p, vb.float())  # (Sq, Hkv, G, D)
        out[b] = o.reshape(Sq, Hq, D)
        lse[b] = (m + torch.log(l)).squeeze(-1).reshape(Hq, Sq)
    return out, lse

"""The calls of :mod:`.attention_varlen`: ours (``flash_attn`` packed / paged / windowed, and the dense
kernel per sequence) and FlashAttention-4's (``flash_attn_varlen_func`` / ``flash_attn_func``), as
``(label, callable)`` lists over the inputs of :func:`.attention_varlen_cases.make_inputs`."""

from __future__ import annotations

import inspect

from .attention_varlen_cases import Case


# ---------------------------------------------------------------------------------------- calls
def _fa4_window(case: Case) -> tuple:
    """FA4's window_size: None for an unbounded side (it sets the right side to 0 under causal)."""
    return tuple(None if w < 0 else int(w) for w in case.window)


def _flat(t, total: int):
    return t.reshape(total, t.shape[-2], t.shape[-1])


def ours_calls(case: Case, inp: dict) -> list:
    """[(form, run, get (total_q, Hq, D) output)] for ours, in the order to try (paged: dense q first,
    then packed q); empty for a paged case while ``flash_attn`` has no ``block_table``."""
    import torch

    from ...attention.forward import flash_attn

    Tq = case.offsets_q()[-1]
    kw = {"causal": case.causal}
    if case.windowed:
        kw["window_size"] = tuple(case.window)
    q = inp["q"]
    out = torch.empty_like(q)
    if case.mode == "varlen":
        return [("flash_attn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal"
                 + (", window_size" if case.windowed else "") + ", out)",
                 lambda: flash_attn(q, inp["k"], inp["v"], cu_seqlens_q=inp["cu_q"], cu_seqlens_k=inp["cu_k"],
                                    max_seqlen_q=case.max_q, max_seqlen_k=case.max_k, out=out, **kw),
                 lambda: out)]
    if case.mode == "dense":
        return [("flash_attn(q, k, v, causal" + (", window_size" if case.windowed else "") + ", out)",
                 lambda: flash_attn(q, inp["k"], inp["v"], out=out, **kw), lambda: _flat(out, Tq))]
    if not paged_supported():
        return []
    kp, vp, bt, su = inp["kp"], inp["vp"], inp["block_table"], inp["seqused_k"]
    qf, out_f = inp["q_flat"], out.view(Tq, case.Hq, case.D)
    pkw = dict(block_table=bt, seqused_k=su, **kw)
    packed = dict(cu_seqlens_q=inp["cu_q"], max_seqlen_q=case.max_q)
    qforms = [("q (B, Sq, Hq, D)", q, out, {}),
              ("q (total_q, Hq, D), cu_seqlens_q, max_seqlen_q", qf, out_f, packed),
              ("q (total_q, Hq, D), cu_seqlens_q, max_seqlen_q, max_seqlen_k", qf, out_f,
               dict(packed, max_seqlen_k=case.max_k))]
    calls = []
    for what, qq, oo, extra in qforms:
        head = f"flash_attn({what}, k_pages, v_pages, block_table, seqused_k, causal"
        calls.append((head + ", out)", lambda qq=qq, oo=oo, extra=extra: flash_attn(qq, kp, vp, out=oo, **extra, **pkw),
                      lambda: out_f))
        got: list = []  # the same without out= (the result returned)

        def returned(qq=qq, extra=extra, got=got):
            got[:] = [flash_attn(qq, kp, vp, **extra, **pkw)]
            return got[0]

        calls.append((head + ") (no out=)", returned, lambda got=got: _flat(got[0], Tq)))
    return calls


def dense_per_seq_call(case: Case, inp: dict) -> tuple:
    """(form, run, get): the dense kernel once per packed sequence (views (1, L, H, D) of the packed q,
    k, v and of one packed output), launches back to back."""
    import torch

    from ...attention.forward import flash_attn

    q, k, v = inp["q"], inp["k"], inp["v"]
    out = torch.empty_like(q)
    oq, ok_ = case.offsets_q(), case.offsets_k()
    parts = [tuple(t.narrow(0, o, n).unsqueeze(0) for t, o, n in ((q, oq[b], lq), (k, ok_[b], lk), (v, ok_[b], lk),
                                                                  (out, oq[b], lq)))
             for b, (lq, lk) in enumerate(zip(case.lens_q, case.lens_k)) if lq > 0 and lk > 0]  # (narrow: fake tensors)
    causal = case.causal

    def run():
        for qq, kk, vv, oo in parts:
            flash_attn(qq, kk, vv, causal=causal, out=oo)

    return f"flash_attn(q (1, L, Hq, D), ...) per sequence, {len(parts)} calls", run, lambda: out


def fa4_functions():
    """(flash_attn_func, flash_attn_varlen_func, why not) of FlashAttention-4 (``flash_attn.cute``)."""
    why = ""
    for mod in ("flash_attn.cute.interface", "flash_attn.cute"):
        try:
            m = __import__(mod, fromlist=["flash_attn_func", "flash_attn_varlen_func"])
            return m.flash_attn_func, m.flash_attn_varlen_func, ""
        except Exception as e:  # noqa: BLE001 - not installed (or broken)
            why = f"{type(e).__name__}: {str(e)[:100]}"
    return None, None, why


def fa4_calls(case: Case, inp: dict, fa4, fa4v, prefer_packed_q: bool = False) -> list:
    """[(form, run, get (total_q, Hq, D))] for FA4 (it returns (out, lse)), in the order to try."""
    Tq = case.offsets_q()[-1]
    w = _fa4_window(case)
    c = case.causal
    q = inp["q"]
    if case.mode == "varlen":
        return [("flash_attn_varlen_func(q, k, v, cu_seqlens_q=, cu_seqlens_k=, max_seqlen_q=, max_seqlen_k=, "
                 f"causal={c}, window_size={w})",
                 lambda: fa4v(q, inp["k"], inp["v"], cu_seqlens_q=inp["cu_q"], cu_seqlens_k=inp["cu_k"],
                              max_seqlen_q=case.max_q, max_seqlen_k=case.max_k, causal=c, window_size=w)[0])]
    if case.mode == "dense":
        return [(f"flash_attn_func(q, k, v, causal={c}, window_size={w})",
                 lambda: _flat(fa4(q, inp["k"], inp["v"], causal=c, window_size=w)[0], Tq))]
    kp, vp, bt, su = inp["kp"], inp["vp"], inp["block_table"], inp["seqused_k"]
    dense_q = (f"flash_attn_varlen_func(q (B, Sq, Hq, D), k_pages, v_pages, seqused_k=, page_table=, causal={c}, "
               f"window_size={w})",
               lambda: _flat(fa4v(q, kp, vp, seqused_k=su, page_table=bt, causal=c, window_size=w)[0], Tq))
    packed_q = ("flash_attn_varlen_func(q (total_q, Hq, D), k_pages, v_pages, cu_seqlens_q=, max_seqlen_q=, "
                f"seqused_k=, page_table=, causal={c}, window_size={w})",
                lambda: fa4v(inp["q_flat"], kp, vp, cu_seqlens_q=inp["cu_q"], max_seqlen_q=case.max_q, seqused_k=su,
                             page_table=bt, causal=c, window_size=w)[0])
    return [packed_q, dense_q] if prefer_packed_q else [dense_q, packed_q]


def paged_gate() -> str:
    """Why ours cannot run paged here ("" when it can): no ``block_table`` in this version's ``flash_attn``."""
    if not paged_supported():
        return "flash_attn has no block_table / seqused_k in this version (paged K/V not merged yet)"
    return ""


def paged_supported() -> bool:
    """Whether this version's ``flash_attn`` takes a paged K/V cache (``block_table`` and ``seqused_k``)."""
    from ...attention.forward import flash_attn

    params = inspect.signature(flash_attn).parameters
    return "block_table" in params and "seqused_k" in params

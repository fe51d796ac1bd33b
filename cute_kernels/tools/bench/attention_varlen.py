"""Attention forward on packed, paged and windowed inputs (issue 18): ``flash_attn`` vs FlashAttention-4
(``flash_attn.cute``), one process, one timer -- ``python profiles/bench_attention.py --varlen``.

Cases (bf16, hq32 hkv8 d128, causal bottom-right; ``--quick``: smaller versions of the same three):

1. ``varlen``: 32 packed sequences, lengths log-uniform in 1..8192 (``random.Random(0)``, recorded in
   the row), q and k/v packed with the same lengths.  Ours: ``flash_attn(cu_seqlens_q/k, max_seqlen_q/k)``;
   FA4: ``flash_attn_varlen_func`` with the same arguments.
2. ``window``: b2 s16384, ``window_size=(4096, 0)`` with causal, dense.  FA4: ``flash_attn_func(
   window_size=(4096, 0), causal=True)``.
3. ``paged`` (run last: the newest kernel; rows are written as they finish and a case that raises
   becomes a ``failed`` row): B = 8, 2048 new tokens each against 30,000 cached (``seqused_k`` = 32048,
   the new tokens the last 2048 of the cache), pages of 64 in a shuffled order.  Ours: ``flash_attn(
   block_table=, seqused_k=)`` with q dense (8, 2048, 32, 128), else q packed (the first form ours
   accepts; FA4 is given the same form first).  Skipped with a note while ``flash_attn`` has no
   ``block_table``, or while the kernel is held back until its GPU tests pass
   (``CUTE_KERNELS_UNVERIFIED_PAGED`` unset; ``--unverified-paged`` sets it).  FA4:
   ``flash_attn_varlen_func(page_table=, seqused_k=)``.

FLOPs count only the unmasked (query, key) pairs, exactly (:func:`visible_pairs`): 4 * D * Hq * pairs,
query i of a sequence (Lq queries, Lk keys) at position p = i + Lk - Lq seeing keys
max(0, p - left) .. min(Lk - 1, p + right) (causal: right = 0; -1: unbounded).  A square causal
sequence counts S (S + 1) / 2 pairs (the dense bench's S^2 / 2 is 1/S lower).

Our dense kernel at the same work (the issue's target: varlen within 5% of the dense rate), timed in
the same rounds as variants of the varlen row:
- ``cute_dense_eqflops``: a dense causal batch b{B'} s{S'} of (about) the same pairs and the same
  number of query tokens: S' = 2 * pairs / tokens - 1 rounded to a multiple of 128, B' = round(pairs /
  pairs(S')); its rate against ours is ``rate_vs_dense["cute / cute_dense_eqflops"]`` (the median over
  rounds of (F_varlen / t_varlen) / (F_dense / t_dense)).  FA4's dense function on the same batch
  (``fa4_dense_eqflops``) gives FA4's own varlen-to-dense ratio.
- ``cute_dense_per_seq``: the dense kernel called once per sequence (views of the packed tensors, 32
  launches back to back): the same work without packing.

Correctness before any timing: every implementation runs once; each output is compared with FA4's on
the same inputs (the full output, max |diff|), and against a float32 reference on a sample of rows
(per sequence: the first, last, middle, two random rows and the rows at the window's edge; heads 0,
Hq/2 - 1 and Hq - 1) plus the 8 (row, head) pairs where it differs most from FA4's output.  An
implementation with a sampled row off by more than ``REF_ATOL + REF_RTOL * max|ref row|`` is not timed
(an ``error`` entry says why: a wrong kernel makes no speed claim); the full-output difference to FA4
above ``MISMATCH_ATOL`` flags the entry (``mismatch``).

Timing as :mod:`.attention`: ``triton.testing.do_bench`` median, L2 flushed before every call,
``--repeats`` interleaved rounds with the order rotated; ratios per round.  The ceiling is a bf16 cuBLAS
matmul of the same FLOPs (``cublas_same_flops``).  Results: ``attention-varlen[-TAG]-DATE-COMMIT``
.json / .md in ``--out``.

``--list`` prints the cases (lengths, pairs, FLOPs, the dense batch, the call forms) without a GPU;
``--dry-run`` builds every full-size input as fake CUDA tensors and passes each call of ours through
``flash_attn``'s validation and planning (no GPU, no memory).
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import inspect
import json
import math
import os
import random
import statistics
import time

from ..args import OneLineParser, int_in
from . import results

KIND = "attention-varlen"
TITLE = "Attention forward bf16: packed (varlen), paged and windowed"
OURS, PEER, MATMUL = "cute", "fa4", "cublas_same_flops"
DENSE_EQ, DENSE_SEQ, FA4_DENSE_EQ = "cute_dense_eqflops", "cute_dense_per_seq", "fa4_dense_eqflops"
#: a sampled output row is wrong when max|o - ref| > REF_ATOL + REF_RTOL * max|ref|
REF_ATOL, REF_RTOL = 2e-3, 5e-2
MISMATCH_ATOL = 2e-2  # full-output |diff| to FA4 that flags an entry (bf16 kernels agree to ~1e-3)
WORST_ROWS = 8  # (row, head) pairs of largest difference to FA4 added to the reference check
TARGET_VS_DENSE = 0.95  # issue 18: varlen within 5% of the dense kernel's rate
DEVICE = "cuda"  # where :func:`build` makes the inputs (the CPU tests run the whole row with stand-ins)


# ---------------------------------------------------------------------------------------- cases
@dataclasses.dataclass(frozen=True)
class Case:
    """One problem: per-sequence query / key lengths; ``mode`` "varlen" (packed q and k/v), "paged"
    (k/v in pages of ``page`` rows) or "dense" (q (B, S, Hq, D), every sequence the same length)."""

    name: str
    mode: str
    lens_q: tuple
    lens_k: tuple
    Hq: int = 32
    Hkv: int = 8
    D: int = 128
    causal: bool = True
    window: tuple = (-1, -1)
    page: int = 0
    seed: int = 0

    @property
    def B(self) -> int:
        return len(self.lens_q)

    @property
    def max_q(self) -> int:
        return max(self.lens_q, default=0)

    @property
    def max_k(self) -> int:
        return max(self.lens_k, default=0)

    def offsets_q(self) -> list:
        """cu_seqlens_q as a list: sequence b's query rows are offsets[b] .. offsets[b + 1] - 1."""
        out = [0]
        for n in self.lens_q:
            out.append(out[-1] + n)
        return out

    def offsets_k(self) -> list:
        out = [0]
        for n in self.lens_k:
            out.append(out[-1] + n)
        return out

    @property
    def windowed(self) -> bool:
        return tuple(self.window) != (-1, -1)


def log_uniform_lengths(n: int, lo: int, hi: int, seed: int = 0) -> list:
    """``n`` integer lengths log-uniform in ``lo..hi`` (``random.Random(seed)``: the same on every machine)."""
    rng = random.Random(seed)
    a, b = math.log(lo), math.log(hi)
    return [min(hi, max(lo, int(round(math.exp(rng.uniform(a, b)))))) for _ in range(n)]


def cases(quick: bool = False) -> list:
    """The issue's three cases (``quick``: the same kinds, smaller); the paged one last (its kernel is the
    newest: a fault there cannot lose the other rows, written as each finishes)."""
    if quick:
        lens = tuple(log_uniform_lengths(8, 1, 2048, 0))
        return [Case("varlen_b8_logu1-2048_hq32_hkv8_d128_causal", "varlen", lens, lens),
                Case("window1024_b1_hq32_hkv8_s4096_d128_causal", "dense", (4096,), (4096,), window=(1024, 0)),
                Case("paged_b2_q512_k4608_p64_hq32_hkv8_d128_causal", "paged", (512,) * 2, (4608,) * 2, page=64)]
    lens = tuple(log_uniform_lengths(32, 1, 8192, 0))
    return [Case("varlen_b32_logu1-8192_hq32_hkv8_d128_causal", "varlen", lens, lens),
            Case("window4096_b2_hq32_hkv8_s16384_d128_causal", "dense", (16384,) * 2, (16384,) * 2,
                 window=(4096, 0)),
            Case("paged_b8_q2048_k32048_p64_hq32_hkv8_d128_causal", "paged", (2048,) * 8, (32048,) * 8, page=64)]


def select(only: str = "", quick: bool = False) -> list:
    """The cases whose name contains one of the comma-separated substrings of ``only`` (all when empty)."""
    keys = [s.strip() for s in only.split(",") if s.strip()]
    return [c for c in cases(quick) if not keys or any(k in c.name for k in keys)]


# ---------------------------------------------------------------------------------------- FLOPs
def _sides(causal: bool, window) -> tuple:
    left, right = (int(window[0]), int(window[1])) if window is not None else (-1, -1)
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def visible_pairs(lq: int, lk: int, causal: bool = False, window=(-1, -1)) -> int:
    """Unmasked (query, key) pairs of one sequence and head: query i (position p = i + lk - lq,
    bottom-right) sees keys max(0, p - left) .. min(lk - 1, p + right); causal sets right to 0; a side
    of -1 is unbounded.  Rows that see nothing count 0."""
    left, right = _sides(causal, window)
    if left < 0 and right < 0:
        return lq * lk
    total, off = 0, lk - lq
    for i in range(lq):
        p = i + off
        lo = 0 if left < 0 else max(0, p - left)
        hi = lk - 1 if right < 0 else min(lk - 1, p + right)
        if hi >= lo:
            total += hi - lo + 1
    return total


def case_pairs(case: Case) -> int:
    """Unmasked pairs of one head summed over the sequences."""
    return sum(visible_pairs(a, b, case.causal, case.window) for a, b in zip(case.lens_q, case.lens_k))


def flops_bytes(case: Case) -> tuple:
    """(FLOPs of the unmasked pairs: 4 * D * Hq * pairs; bf16 bytes of q, k, v read once and o written once,
    k/v only the used rows)."""
    fl = 4.0 * case.D * case.Hq * case_pairs(case)
    nb = 2.0 * case.D * (2 * case.Hq * sum(case.lens_q) + 2 * case.Hkv * sum(case.lens_k))
    return fl, nb


def dense_equivalent(case: Case) -> Case:
    """A dense square batch of (about) the same pairs and query tokens as ``case`` (causal, no window):
    S' = 2 * pairs / tokens - 1 rounded to a multiple of 128 (>= 128), B' = round(pairs / pairs(S'))."""
    pairs, tokens = case_pairs(case), sum(case.lens_q)
    s = max(128, int(round((2.0 * pairs / max(1, tokens) - 1) / 128)) * 128)
    b = max(1, int(round(pairs / visible_pairs(s, s, case.causal))))
    return Case(f"dense_b{b}_hq{case.Hq}_hkv{case.Hkv}_s{s}_d{case.D}{'_causal' if case.causal else ''}", "dense",
                (s,) * b, (s,) * b, case.Hq, case.Hkv, case.D, case.causal, seed=case.seed + 1)


# ---------------------------------------------------------------------------------------- inputs
def make_inputs(case: Case, device="cuda", dtype=None) -> dict:
    """The case's tensors on ``device`` (randn, ``torch.manual_seed(case.seed)``); the keys every mode has:
    ``q_flat`` (total_q, Hq, D), ``offs_q`` / ``offs_k`` (python lists) and ``kv_seq(b) -> (k, v)`` each
    (Lk_b, Hkv, D).  varlen: q, k, v packed, cu_q, cu_k; paged: q (B, Sq, Hq, D) (every Sq equal), kp,
    vp (pages, page, Hkv, D) -- every row finite, also past seqused_k -- block_table (B, pages per
    sequence) int32 of a shuffled page order, seqused_k (B,) int32, cu_q; dense: q (B, S, Hq, D), k, v."""
    import torch

    dt = dtype or torch.bfloat16
    torch.manual_seed(case.seed)
    Hq, Hkv, D, B = case.Hq, case.Hkv, case.D, case.B
    offs_q, offs_k = case.offsets_q(), case.offsets_k()
    inp = {"offs_q": offs_q, "offs_k": offs_k}
    if case.mode == "varlen":
        q = torch.randn(offs_q[-1], Hq, D, device=device, dtype=dt)
        k = torch.randn(offs_k[-1], Hkv, D, device=device, dtype=dt)
        v = torch.randn(offs_k[-1], Hkv, D, device=device, dtype=dt)
        inp.update(q=q, k=k, v=v, q_flat=q,
                   cu_q=torch.tensor(offs_q, dtype=torch.int32, device=device),
                   cu_k=torch.tensor(offs_k, dtype=torch.int32, device=device),
                   kv_seq=lambda b: (k.narrow(0, offs_k[b], case.lens_k[b]), v.narrow(0, offs_k[b], case.lens_k[b])))
        return inp
    if len(set(case.lens_q)) > 1 or (case.mode == "dense" and len(set(case.lens_k)) > 1):
        raise ValueError(f"{case.name}: {case.mode} inputs need every sequence of the same length")
    Sq = case.lens_q[0]
    q = torch.randn(B, Sq, Hq, D, device=device, dtype=dt)
    inp.update(q=q, q_flat=q.view(B * Sq, Hq, D), cu_q=torch.tensor(offs_q, dtype=torch.int32, device=device))
    if case.mode == "dense":
        Sk = case.lens_k[0]
        k = torch.randn(B, Sk, Hkv, D, device=device, dtype=dt)
        v = torch.randn(B, Sk, Hkv, D, device=device, dtype=dt)
        inp.update(k=k, v=v, kv_seq=lambda b: (k[b], v[b]))
        return inp
    if case.mode != "paged" or case.page < 1:
        raise ValueError(f"{case.name}: unknown mode {case.mode!r} (or page < 1)")
    P = case.page
    pps = -(-case.max_k // P)  # pages per sequence (the block table's width)
    n_pages = B * pps
    kp = torch.randn(n_pages, P, Hkv, D, device=device, dtype=dt)
    vp = torch.randn(n_pages, P, Hkv, D, device=device, dtype=dt)
    perm = list(range(n_pages))
    random.Random(case.seed).shuffle(perm)  # the pages in a shuffled order (python: also under fake tensors)
    bt = torch.tensor(perm, dtype=torch.int32, device=device).view(B, pps)
    seqused = torch.tensor(case.lens_k, dtype=torch.int32, device=device)

    def kv_seq(b):
        idx = bt[b].long()
        n = case.lens_k[b]
        return (kp.index_select(0, idx).reshape(-1, Hkv, D).narrow(0, 0, n),
                vp.index_select(0, idx).reshape(-1, Hkv, D).narrow(0, 0, n))

    inp.update(kp=kp, vp=vp, block_table=bt, seqused_k=seqused, kv_seq=kv_seq)
    return inp


# ---------------------------------------------------------------------------------------- reference
def sample_rows(case: Case, seed: int = 0) -> list:
    """(sequence, query row, head) triples checked against the float32 reference: per sequence the rows
    0, 1, Lq/3, Lq/2, Lq-2, Lq-1, two random ones and, with a left window side, the rows where the window
    starts to cut (p - left = -1, 0, 1); heads 0, Hq/2 - 1, Hq - 1."""
    rng = random.Random(seed)
    heads = sorted({0, max(0, case.Hq // 2 - 1), case.Hq - 1})
    left, _ = _sides(case.causal, case.window)
    out = []
    for b, (lq, lk) in enumerate(zip(case.lens_q, case.lens_k)):
        if lq == 0:
            continue
        rows = {0, 1, lq // 3, lq // 2, lq - 2, lq - 1, rng.randrange(lq), rng.randrange(lq)}
        if left >= 0:
            edge = left - (lk - lq)  # the row whose window starts at key 0
            rows |= {edge - 1, edge, edge + 1}
        out += [(b, i, h) for i in sorted(r for r in rows if 0 <= r < lq) for h in heads]
    return out


def reference_rows(case: Case, inp: dict, triples, scale: float | None = None):
    """float32 attention output of each (sequence, row, head) triple, (n, D) in the triples' order
    (a row that sees no key: zeros)."""
    import torch

    D, g = case.D, case.Hq // case.Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    left, right = _sides(case.causal, case.window)
    q_flat, offs = inp["q_flat"], inp["offs_q"]
    out = torch.zeros(len(triples), D, dtype=torch.float32, device=q_flat.device)
    groups: dict = {}
    for n, (b, i, h) in enumerate(triples):
        groups.setdefault(b, {}).setdefault(h, []).append((n, i))
    for b, by_head in groups.items():
        k_seq, v_seq = inp["kv_seq"](b)
        lq, lk = case.lens_q[b], case.lens_k[b]
        if lk == 0:
            continue
        j = torch.arange(lk, device=q_flat.device)
        for h, items in by_head.items():
            idx = [n for n, _ in items]
            rows = torch.tensor([i for _, i in items], device=q_flat.device)
            qr = q_flat[offs[b] + rows, h].float()  # (r, D)
            kk, vv = k_seq[:, h // g].float(), v_seq[:, h // g].float()  # (lk, D)
            s = (qr @ kk.T) * scale
            p = (rows + (lk - lq))[:, None]
            ok = torch.ones_like(s, dtype=torch.bool)
            if left >= 0:
                ok &= j[None, :] >= p - left
            if right >= 0:
                ok &= j[None, :] <= p + right
            s = s.masked_fill(~ok, float("-inf"))
            w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row without keys: all -inf -> 0
            out[idx] = w @ vv
    return out


def check_rows(out_flat, offs_q, triples, ref) -> dict:
    """Compare an output (total_q, Hq, D) with ``reference_rows`` at ``triples``: max |err|, max |err| /
    max|ref row|, and ``ok`` (every row within REF_ATOL + REF_RTOL * max|ref row|, all finite)."""
    import torch

    if not triples:
        return {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "rows_checked": 0}
    tok = torch.tensor([offs_q[b] + i for b, i, _ in triples], device=out_flat.device)
    hd = torch.tensor([h for *_, h in triples], device=out_flat.device)
    got = out_flat[tok, hd].float()
    err = (got - ref).abs().amax(-1)
    mag = ref.abs().amax(-1)
    err = torch.where(torch.isfinite(err), err, torch.full_like(err, float("inf")))
    bad = err > REF_ATOL + REF_RTOL * mag
    worst = int(torch.argmax(err - (REF_ATOL + REF_RTOL * mag)).item())
    return {"ok": not bool(bad.any().item()), "max_abs_err": float(err.max().item()),
            "max_rel_err": float((err / mag.clamp_min(1e-6)).max().item()), "rows_checked": len(triples),
            "rows_wrong": int(bad.sum().item()), "worst": list(triples[worst])}


def max_diff(a, b, chunk: int = 8192, topk: int = WORST_ROWS) -> tuple:
    """(max |a - b| over two (total, H, D) outputs, the ``topk`` (token, head) pairs of largest
    difference), in chunks of tokens (no full-size float32 copy)."""
    import torch

    best, cands = 0.0, []
    for s in range(0, a.shape[0], chunk):
        d = (a[s:s + chunk].float() - b[s:s + chunk].float()).abs().amax(-1)  # (t, H)
        d = torch.where(torch.isfinite(d), d, torch.full_like(d, float("inf")))
        best = max(best, float(d.max().item()))
        vals, idx = d.flatten().topk(min(topk, d.numel()))
        H = d.shape[1]
        cands += [(float(v), s + int(ix) // H, int(ix) % H) for v, ix in zip(vals.tolist(), idx.tolist())]
    cands.sort(reverse=True)
    return best, [(t, h) for _, t, h in cands[:topk]]


def token_to_row(offs_q, tok: int) -> tuple:
    """(sequence, row) of a packed token index."""
    b = bisect.bisect_right(offs_q, tok) - 1  # the last start <= tok: never an empty sequence's
    return b, tok - offs_q[b]


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
    """Why ours cannot run paged here ("" when it can): no ``block_table`` in ``flash_attn``, or the kernel
    held back until its GPU tests pass (``forward.UNVERIFIED_PAGED_ENV`` unset; ``--unverified-paged``)."""
    from ...attention import forward as FW

    if not paged_supported():
        return "flash_attn has no block_table / seqused_k in this version (paged K/V not merged yet)"
    env = getattr(FW, "UNVERIFIED_PAGED_ENV", None)
    if env and os.environ.get(env, "0") in ("0", "", "false", "off"):
        return (f"the paged kernel is held back until its GPU tests pass ({env} unset; --unverified-paged sets it: "
                "its output is still checked against float32 and FA4 before any timing)")
    return ""


def paged_supported() -> bool:
    """Whether this version's ``flash_attn`` takes a paged K/V cache (``block_table`` and ``seqused_k``)."""
    from ...attention.forward import flash_attn

    params = inspect.signature(flash_attn).parameters
    return "block_table" in params and "seqused_k" in params


# ---------------------------------------------------------------------------------------- one case
@dataclasses.dataclass
class Impl:
    run: object
    get: object  # -> (total_q, Hq, D) output of the last run
    problem: str  # key into the problems dict (the inputs it ran on)
    role: str
    flops: float
    nbytes: float
    form: str
    first_call_s: float = 0.0


def _first_that_runs(calls, notes, label):
    """(form, run, get, first call seconds) of the first call form that runs, else None (notes say why)."""
    import torch

    for form, run, *get in calls:
        try:
            t0 = time.time()
            run()
            torch.cuda.synchronize()
            dt = time.time() - t0
        except Exception as e:  # noqa: BLE001 - this form or this implementation cannot run: a note
            notes.append(f"{label}: {form}: {type(e).__name__}: {str(e)[:200]}")
            continue
        return form, run, (get[0] if get else run), dt  # FA4's get: run it again (it returns its output)
    return None


def build(case: Case, notes: list) -> tuple:
    """({problem key: (Case, inputs)}, {name: Impl}) for one case, every implementation run once (compiled)."""
    fa4, fa4v, why = fa4_functions()
    fl, nb = flops_bytes(case)
    problems = {"main": (case, make_inputs(case, DEVICE))}
    impls: dict = {}

    def add(name, role, problem, calls, flops, nbytes):
        got = _first_that_runs(calls, notes, name)
        if got is not None:
            form, run, get, dt = got
            impls[name] = Impl(run, get, problem, role, flops, nbytes, form, dt)
        return got

    inp = problems["main"][1]
    gate = paged_gate() if case.mode == "paged" else ""
    if gate:
        notes.append(f"{OURS}: skipped: {gate}; fa4 timed alone, checked against the float32 reference")
    got = None if gate else add(OURS, "ours", "main", ours_calls(case, inp), fl, nb)
    packed = got is not None and "total_q" in got[0]
    if fa4 is None:
        notes.append(f"{PEER}: skipped, flash_attn.cute not importable ({why})")
    else:
        add(PEER, "peer", "main", fa4_calls(case, inp, fa4, fa4v, prefer_packed_q=packed), fl, nb)
    if case.mode == "varlen":
        add(DENSE_SEQ, "variant", "main", [dense_per_seq_call(case, inp)], fl, nb)
        dcase = dense_equivalent(case)
        dfl, dnb = flops_bytes(dcase)
        problems["dense"] = (dcase, make_inputs(dcase, DEVICE))
        dinp = problems["dense"][1]
        add(DENSE_EQ, "variant", "dense", ours_calls(dcase, dinp), dfl, dnb)
        if fa4 is not None:
            add(FA4_DENSE_EQ, "variant", "dense", fa4_calls(dcase, dinp, fa4, fa4v), dfl, dnb)
    return problems, impls


def check(problems: dict, impls: dict) -> dict:
    """{name: check entry}: each output against FA4's (full, max |diff|) and the float32 reference on the
    sampled rows plus the rows of largest difference to FA4; ``ok`` False: not to be timed."""
    import torch

    out: dict = {}
    for key, (case, inp) in problems.items():
        names = [n for n, im in impls.items() if im.problem == key]
        ref_name = next((n for n in names if n in (PEER, FA4_DENSE_EQ)), None)
        triples = sample_rows(case)
        diffs: dict = {}
        if ref_name is not None:
            base = impls[ref_name].get()
            for n in names:
                if n == ref_name:
                    continue
                d, worst = max_diff(impls[n].get(), base)
                diffs[n] = d
                triples += [(*token_to_row(inp["offs_q"], t), h) for t, h in worst]
            del base
        triples = sorted(set(triples))
        ref = reference_rows(case, inp, triples)
        for n in names:
            c = check_rows(impls[n].get(), inp["offs_q"], triples, ref)
            if ref_name is not None and n != ref_name:
                c[f"max_abs_diff_vs_{ref_name}"] = diffs[n]
                c["mismatch"] = not diffs[n] <= MISMATCH_ATOL
            out[n] = c
        del ref
        torch.cuda.synchronize()
    return out


def rate_ratio(a: dict, b: dict, fa: float, fb: float) -> float | None:
    """Median over rounds of (fa / t_a) / (fb / t_b) for two impl entries (their rates' ratio)."""
    ta, tb = a.get("times_us") or [], b.get("times_us") or []
    if not ta or not tb:
        return None
    if len(ta) == len(tb):
        return statistics.median((fa / x) / (fb / y) for x, y in zip(ta, tb))
    return (fa / a["median_us"]) / (fb / b["median_us"])


def run_case(case: Case, bench, repeats: int, prog) -> dict:
    """One row: build, check, time the implementations that passed, and the extra figures."""
    import torch

    from .ceiling import matmul_same_flops
    from .timing import time_rounds

    notes: list = []
    problems, impls = build(case, notes)
    checks = check(problems, impls)
    fl, nb = flops_bytes(case)
    todo = {n: im.run for n, im in impls.items() if checks[n]["ok"]}
    mm_fn, mm_flops = matmul_same_flops(fl)
    todo[MATMUL] = mm_fn
    times = time_rounds(todo, bench, repeats, tick=lambda n, s=case.name: prog.step(f"{s[:24]} {n}"))
    row = {"shape": case.name, "params": case_params(case), "lengths_q": list(case.lens_q), "lengths_k": list(case.lens_k),
           "pairs_per_head": case_pairs(case), "flops": fl, "bytes": nb, "bound": "compute",
           "reference": "float32 on sampled rows" + (f"; full output vs {PEER}" if PEER in impls else ""),
           "impls": {}, "notes": notes, "ceiling": MATMUL, "ours": OURS if OURS in impls else None}
    for n, im in impls.items():
        c = checks[n]
        extra = {"form": im.form, "first_call_s": round(im.first_call_s, 3), "check": c}
        if n in times:
            e = results.impl_entry(im.role, times[n], im.flops, im.nbytes, **extra)
            e["mismatch"] = bool(c.get("mismatch"))
        else:
            e = {"role": im.role, "error": f"wrong output, not timed (max err {c['max_abs_err']:.3g})", **extra}
            notes.append(f"{n}: WRONG OUTPUT, not timed: {c.get('rows_wrong')} of {c['rows_checked']} sampled rows off "
                         f"(max |err| {c['max_abs_err']:.3g}, worst (seq, row, head) {c.get('worst')})")
        if im.flops != fl:
            e["flops"] = im.flops
        row["impls"][n] = e
    scale = fl / mm_flops
    row["impls"][MATMUL] = results.impl_entry("ceiling", [t * scale for t in times[MATMUL]], fl, nb,
                                              matmul_n=round((mm_flops / 2) ** (1 / 3)))
    if case.mode == "varlen":
        dcase = problems["dense"][0]
        row["dense_eqflops"] = {"shape": dcase.name, "B": dcase.B, "S": dcase.max_q,
                                "pairs_per_head": case_pairs(dcase), "flops": flops_bytes(dcase)[0],
                                "flops_vs_varlen": flops_bytes(dcase)[0] / fl,
                                "method": "dense causal batch of about the same pairs and query tokens: "
                                          "S' = 2 * pairs / tokens - 1 rounded to 128, B' = round(pairs / pairs(S'))"}
        rv, ie = {}, row["impls"]
        for a, b in ((OURS, DENSE_EQ), (OURS, DENSE_SEQ), (PEER, FA4_DENSE_EQ)):
            if a in ie and b in ie and ie[a].get("median_us") and ie[b].get("median_us"):
                rv[f"{a} / {b}"] = rate_ratio(ie[a], ie[b], impls[a].flops, impls[b].flops)
        row["rate_vs_dense"] = rv
        x = rv.get(f"{OURS} / {DENSE_EQ}")
        row["meets_target_vs_dense"] = None if x is None else x >= TARGET_VS_DENSE
    for k in list(problems):
        del problems[k]
    del impls, todo, mm_fn
    torch.cuda.empty_cache()
    return row


# ---------------------------------------------------------------------------------------- run
def our_configs(case: Case) -> list:
    """The configurations of ours a case runs (what :func:`precompile` compiles): the kernel's plan for
    the case's static facts as ``flash_attn`` derives them (``check_window``), plus the dense causal
    kernel of the varlen comparisons; the paged one (q dense, its first form) where ``plan`` takes
    ``page_size``."""
    import torch

    from ...attention import forward as FW

    bf16 = torch.bfloat16
    causal, win = FW.check_window(tuple(case.window), case.causal)
    if case.mode == "varlen":
        return [FW.plan(bf16, case.D, causal, varlen=True, window=win is not None), FW.plan(bf16, case.D, case.causal)]
    if case.mode == "dense":
        return [FW.plan(bf16, case.D, causal, window=win is not None)]
    if paged_supported() and "page_size" in inspect.signature(FW.plan).parameters:
        try:
            return [FW.plan(bf16, case.D, causal, window=win is not None, page_size=case.page)]
        except Exception as e:  # noqa: BLE001 - another plan signature: compiled at the first call instead
            print(f"paged plan not precompiled: {type(e).__name__}: {str(e)[:120]}", flush=True)
    return []


def precompile(selected) -> None:
    """Our configurations of the run compiled in parallel processes (disk cache) before timing (a paged
    one that :func:`our_configs` cannot name compiles at its first call, also before timing)."""
    from ...attention import forward as FW
    from .timing import precompile_and_report

    cfgs = {cfg for c in selected if not (c.mode == "paged" and paged_gate()) for cfg in our_configs(c)}
    if cfgs:
        precompile_and_report(FW.precompile, sorted(cfgs, key=repr))


def _document(meta: dict, rows: list, roofs: dict) -> dict:
    doc = results.document(KIND, meta, [dict(r) for r in rows], roofs, notes=[
        "FLOPs: 4 * D * Hq * unmasked (query, key) pairs, counted exactly per sequence (bottom-right causal, "
        "window [p - left, p + right], p = i + Lk - Lq).",
        f"Correctness gate before timing: float32 reference on sampled rows (+ the {WORST_ROWS} rows of largest "
        f"difference to FA4); a row off by more than {REF_ATOL} + {REF_RTOL} * max|ref row| means not timed."])
    s = doc["summary"]
    s["mismatches"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items() if v.get("mismatch")]
    s["wrong_outputs"] = [f"{r['shape']}:{n}" for r in doc["rows"] for n, v in r["impls"].items() if "error" in v]
    s["failed_cases"] = [r["shape"] for r in doc["rows"] if r.get("failed")]
    for r in doc["rows"]:
        if r.get("rate_vs_dense"):
            s["varlen_rate_vs_dense"] = r["rate_vs_dense"]
    return doc


def case_params(case: Case) -> dict:
    return {"mode": case.mode, "B": case.B, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "causal": case.causal,
            "window": list(case.window), "page": case.page or None, "max_seqlen_q": case.max_q,
            "max_seqlen_k": case.max_k, "total_q": sum(case.lens_q), "total_k": sum(case.lens_k)}


def run(selected, repeats: int = 3, quick: bool = False, roofs: bool = True, on_row=None) -> dict:
    """Benchmark the cases; returns the results document (kind ``attention-varlen``).  ``on_row(doc)``
    after each case with the document so far (the files are rewritten as rows finish); a case that
    raises becomes a row with ``failed`` and its error in the notes, and the run goes on."""
    import torch

    from .ceiling import measure_roofs
    from .progress import Progress
    from .timing import make_bench

    if not torch.cuda.is_available():
        raise RuntimeError("bench attention --varlen needs a CUDA device")
    bench, timer = make_bench(quick)
    meta = results.run_meta(timer, repeats, quick=quick)
    measured = {}
    if roofs:
        print("measuring the roofs (read, copy, matmul)", flush=True)
        measured = measure_roofs(bench, quick)
        print(f"roofs: {results.roof_words(measured)}", flush=True)
    precompile(selected)
    rows = []
    per_case = {"varlen": 6, "paged": 3, "dense": 3}
    with Progress(sum(per_case.get(c.mode, 3) for c in selected) * repeats, "bench attention varlen") as prog:
        for case in selected:
            t0 = time.time()
            try:
                row = run_case(case, bench, repeats, prog)
            except Exception as e:  # noqa: BLE001 - one case failing (even a device fault) must not lose the others
                row = {"shape": case.name, "params": case_params(case), "flops": flops_bytes(case)[0],
                       "bytes": flops_bytes(case)[1], "bound": "compute", "impls": {}, "failed": True,
                       "pairs_per_head": case_pairs(case), "lengths_q": list(case.lens_q),
                       "lengths_k": list(case.lens_k), "notes": [f"FAILED: {type(e).__name__}: {str(e)[:400]}"]}
            rows.append(row)
            prog.note(f"{case.name} ({time.time() - t0:.0f} s): " + "  ".join(
                f"{n}={v['median_us']:.0f}us/{v['tflops']:.0f}TF{'!' if v.get('mismatch') else ''}"
                if v.get("median_us") else f"{n}=WRONG" for n, v in row["impls"].items()))
            for k, x in (row.get("rate_vs_dense") or {}).items():
                prog.note(f"    rate {k}: {x:.3f}")
            for nt in row["notes"]:
                prog.note(f"    note: {nt}")
            if on_row is not None:
                on_row(_document(meta, rows, measured))
    return _document(meta, rows, measured)


# ---------------------------------------------------------------------------------------- output
def markdown(doc: dict) -> str:
    """The shared table (:func:`results.markdown`) with this benchmark's title and ceiling, then the
    per-case figures: lengths, the dense comparison, the correctness checks and the call forms."""
    md = results.markdown(doc)
    md = md.replace(f"# {KIND},", f"# {TITLE},", 1).replace(
        "(the ceiling: none)", "(the ceiling: a bf16 cuBLAS matmul of the same FLOPs, cublas_same_flops)")
    lines = ["", "## Per case"]
    for r in doc["rows"]:
        p = r["params"]
        lines += ["", f"### {r['shape']}", "",
                  f"- {p['mode']}, B {p['B']}, hq{p['Hq']} hkv{p['Hkv']} d{p['D']}, causal {p['causal']}, "
                  f"window {tuple(p['window'])}, page {p['page']}; total_q {p['total_q']}, total_k {p['total_k']}; "
                  f"pairs per head {r['pairs_per_head']}, {r['flops'] / 1e12:.4f} TFLOP"]
        if p["mode"] == "varlen":
            lines.append(f"- lengths (q = k): {r['lengths_q']}")
        d = r.get("dense_eqflops")
        if d:
            lines.append(f"- dense at equal work: {d['shape']} ({d['flops'] / 1e12:.4f} TFLOP, "
                         f"{d['flops_vs_varlen']:.3f}x the varlen FLOPs); {d['method']}")
            lines.append(f"- {DENSE_EQ} and {FA4_DENSE_EQ} run that batch: compare their TFLOP/s, not their times; "
                         f"{DENSE_SEQ} runs the varlen row's own sequences")
        for k, x in (r.get("rate_vs_dense") or {}).items():
            lines.append(f"- rate {k}: **{x:.3f}**" + (f" (issue target >= {TARGET_VS_DENSE})"
                                                        if k == f"{OURS} / {DENSE_EQ}" else ""))
        for n, e in r["impls"].items():
            c = e.get("check")
            if not c:
                continue
            diff = next(((k[len("max_abs_diff_vs_"):], v) for k, v in c.items() if k.startswith("max_abs_diff_vs_")),
                        None)
            lines.append(f"- {n}: `{e.get('form')}`; first call {e.get('first_call_s')} s; vs float32 on "
                         f"{c['rows_checked']} rows: max |err| {c['max_abs_err']:.2e} ({'ok' if c['ok'] else 'WRONG'})"
                         + (f"; max |diff| to {diff[0]} {diff[1]:.2e}{' MISMATCH' if c.get('mismatch') else ''}" if diff else ""))
    s = doc.get("summary", {})
    if s.get("wrong_outputs") or s.get("mismatches"):
        lines += ["", f"**Wrong outputs (not timed): {s.get('wrong_outputs')}; mismatches: {s.get('mismatches')}**"]
    return md + "\n".join(lines) + "\n"


def write(doc: dict, out_dir, tag: str = "") -> tuple:
    """``attention-varlen[-TAG]-DATE-COMMIT.json`` and ``.md`` into ``out_dir``; returns their paths."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = out / results.stem(doc["kind"], doc["meta"], tag)
    js, md = Path(f"{base}.json"), Path(f"{base}.md")
    js.write_text(json.dumps(doc, indent=1, default=results._jsonable) + "\n")
    md.write_text(markdown(doc))
    return js, md


def describe(selected) -> str:
    """``--list``: each case, its lengths, pairs, FLOPs, bytes, the dense comparison and the call forms."""
    lines = []
    for c in selected:
        fl, nb = flops_bytes(c)
        lines.append(f"{c.name}: {c.mode}, B {c.B}, hq{c.Hq} hkv{c.Hkv} d{c.D}, causal {c.causal}, "
                     f"window {c.window}, page {c.page or '-'}")
        lines.append(f"  lengths q {list(c.lens_q)}" if c.mode == "varlen" else
                     f"  Sq {c.max_q}, Sk {c.max_k} (seqused_k)" if c.mode == "paged" else f"  S {c.max_q}")
        lines.append(f"  total_q {sum(c.lens_q)}, total_k {sum(c.lens_k)}, pairs/head {case_pairs(c)}, "
                     f"{fl / 1e12:.4f} TFLOP, {nb / 1e9:.3f} GB (q, k, v, o once)")
        if c.mode == "paged":
            pps = -(-c.max_k // c.page)
            lines.append(f"  {c.B * pps} pages of {c.page} ({pps} per sequence, shuffled), "
                         f"{2 * c.B * pps * c.page * c.Hkv * c.D * 2 / 1e9:.3f} GB of K+V pages")
        if c.mode == "varlen":
            d = dense_equivalent(c)
            lines.append(f"  dense at equal work: {d.name}, {flops_bytes(d)[0] / 1e12:.4f} TFLOP "
                         f"({flops_bytes(d)[0] / fl:.3f}x); per-sequence dense: {sum(1 for x in c.lens_q if x)} calls")
        lines.append(f"  sampled reference rows: {len(sample_rows(c))} (sequence, row, head) triples")
    return "\n".join(lines)


def dry_run(selected) -> list:
    """Build each case's full-size inputs as fake CUDA tensors (no memory, no GPU) and pass every call
    form of ours through ``flash_attn`` (validation, shapes of the outputs); the configurations the
    real run precompiles.  Returns lines to print; raises for a case none of whose forms ``flash_attn`` accepts."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    lines = []
    for c in selected:
        todo = [("main", c)] + ([("dense", dense_equivalent(c))] if c.mode == "varlen" else [])
        for what, cc in todo:
            with FakeTensorMode():
                inp = make_inputs(cc, device="cuda")
                calls = ours_calls(cc, inp) + ([dense_per_seq_call(cc, inp)] if cc.mode == "varlen" else [])
                if not calls:
                    lines.append(f"{cc.name}: ours skipped (flash_attn has no block_table / seqused_k)")
                elif cc.mode == "paged" and paged_gate():
                    lines.append(f"{cc.name}: the real run skips ours unless --unverified-paged: {paged_gate()}")
                errs = []
                for form, run, get in calls:
                    try:
                        run()
                        o = get()
                    except Exception as e:  # noqa: BLE001 - reported; a case with no accepted form raises
                        errs.append(f"{form}: {type(e).__name__}: {str(e)[:160]}")
                        continue
                    assert tuple(o.shape) == (sum(cc.lens_q), cc.Hq, cc.D), (form, tuple(o.shape))
                    lines.append(f"{cc.name}: accepted: {form} -> out {tuple(o.shape)}")
                    if cc.mode == "paged":
                        break
                if calls and len(errs) == len(calls):
                    raise RuntimeError(f"{cc.name}: flash_attn accepts no call form: {errs}")
                lines += [f"{cc.name}: not accepted: {e}" for e in errs]
            for cfg in our_configs(cc) if cc is c else []:
                lines.append(f"{c.name}: precompiles head_dim={cfg.head_dim} causal={cfg.causal} varlen={cfg.varlen} "
                             f"window={cfg.window} page_size={getattr(cfg, 'page_size', 0)}")
    return lines


def build_parser(prog: str = "bench_attention.py --varlen") -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller cases, one round, short do_bench")
    ap.add_argument("--repeats", type=int_in(1), default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names (varlen, paged, window)")
    ap.add_argument("--tag", default="", help="suffix of the file names after the kind")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    ap.add_argument("--no-roofs", action="store_true", help="skip measuring the device's roofs (~10 s)")
    ap.add_argument("--unverified-paged", action="store_true",
                    help="run our paged kernel before its GPU tests have passed (sets CUTE_KERNELS_UNVERIFIED_PAGED=1; "
                         "its output is checked against float32 and FA4 before timing; the paged case runs last)")
    ap.add_argument("--list", action="store_true", help="print the cases, their FLOPs and call forms; no GPU")
    ap.add_argument("--dry-run", action="store_true",
                    help="fake CUDA tensors of full size through flash_attn's validation; no GPU")
    return ap


def main(argv: list | None = None, prog: str = "bench_attention.py --varlen") -> int:
    ap = build_parser(prog)
    args = ap.parse_args(argv)
    selected = select(args.only, args.quick)
    if not selected:
        ap.error(f"--only {args.only!r} matches no case ({', '.join(c.name for c in cases(args.quick))})")
    if args.list:
        print(describe(selected))
        return 0
    if args.dry_run:
        print("\n".join(dry_run(selected)))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA device (--list and --dry-run run without one)")
        return 2
    if args.unverified_paged:
        from ...attention import forward as FW

        os.environ[getattr(FW, "UNVERIFIED_PAGED_ENV", "CUTE_KERNELS_UNVERIFIED_PAGED")] = "1"
    tag = args.tag or ("quick" if args.quick else "")
    doc = run(selected, 1 if args.quick else args.repeats, args.quick, roofs=not args.no_roofs,
              on_row=lambda d: write(d, args.out, tag))
    js, md = write(doc, args.out, tag)
    print(markdown(doc))
    print(f"wrote {js} and {md}")
    return 0

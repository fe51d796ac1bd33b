"""The cases of :mod:`.attention_varlen` (issue 18's packed, paged and windowed forwards): their
definitions, the exact FLOP count of visible pairs, the inputs, and the float32 reference on sampled
rows.  Pure torch; no kernel is imported here."""

from __future__ import annotations

import bisect
import dataclasses
import math
import random

#: a sampled output row is wrong when max|o - ref| > REF_ATOL + REF_RTOL * max|ref|
REF_ATOL, REF_RTOL = 2e-3, 5e-2
WORST_ROWS = 8  # (row, head) pairs of largest difference to FA4 added to the reference check


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


def extra_cases() -> list:
    """Cases beyond the issue's, run only when ``--only`` names them: many short packed sequences
    (1024, log-uniform 1..512), where finding a tile's sequence is a larger share of the work."""
    lens = tuple(log_uniform_lengths(1024, 1, 512, 0))
    return [Case("manyshort_b1024_logu1-512_hq32_hkv8_d128_causal", "varlen", lens, lens)]


def select(only: str = "", quick: bool = False) -> list:
    """The cases whose name contains one of the comma-separated substrings of ``only`` (the issue's
    cases when empty; :func:`extra_cases` only by name)."""
    keys = [s.strip() for s in only.split(",") if s.strip()]
    if not keys:
        return cases(quick)
    return [c for c in cases(quick) + extra_cases() if any(k in c.name for k in keys)]


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

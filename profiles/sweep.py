"""Randomized correctness sweep of every public op against a float32 / float64 reference (issue 19).

    python3 profiles/sweep.py                      # >= 120 shapes per op, seed 19, JSON into profiles/results
    python3 profiles/sweep.py --quick              # 24 shapes per op, fewer configurations
    python3 profiles/sweep.py --ops gemm,decode --seed 7 --out /tmp/out
    python3 profiles/sweep.py --list               # the cases and the kernels they compile (CPU: nothing runs)

Shapes are drawn per op from ``random.Random(f"{seed}/{op}")`` (the seed is printed and written to the
results): sizes log-uniform, with tile multiples +-1 (GEMM M/N tiles 64/128/256, K 64; attention
128/192-row query tiles, 64/128-key tiles, decode KV tiles and page sizes) and primes mixed in.  Layout
and feature axes are drawn with them: operand majors, padded / misaligned operands (as planned: staged into
aligned copies or read in place by the cp.async mainloop; one case in six forced each way, ``PlanChoice.stage``), batched GEMM, alpha / beta with C, fp32 / mixed outputs, out views (column-major, padded,
odd row strides); decode paged / contiguous with ragged lengths (0 included), split counts, GQA, Sq 1..16,
causal; merge with empty parts and strided parts; the forward at every head dim, causal and not, GQA,
(B, H, S, D) views.

Compile budget.  Each op has a budget of distinct kernel configurations (``BUDGET``): every candidate
shape is planned on the CPU first (the real planners on meta tensors under ``jit.dry_run``), and one
whose kernel is new is taken only while the configurations seen stay within a linear share of the
budget, so new kernels are spread over the whole list.  The selected kernels are then compiled in
parallel processes into the disk cache (``CUTE_KERNELS_CACHE_DIR``) before any case runs.

Check (``compare``): outputs are poisoned with NaN before the launch (``out=`` where the op has it, the
decode workspace too; merge_states has no ``out=``: the allocator's free blocks of the output's size
are filled with NaN first), and storage around a strided output view must still be NaN afterwards.  Per
element, ``|out - ref| <= rtol * |ref| + atol * scale``, scale = the rms of the reference (GEMM) or the
element's own bound ``P @ |V|`` (attention: the error of rounding P to 16 bits is at most that much per
unit of rtol); and per row (every row and column of a GEMM output, every (query, head) row of an
attention output), ``||out_row - ref_row|| <= row_tol * max(||ref_row||, 1% of the rms)``, so a whole
wrong or unwritten row fails even where the elementwise bound is loose (small outputs of long
sequences).  The last row / column / query (the tail tile) is reported on its own.  The normalized error
is the worst ratio to its bound: <= 1 passes.  LSEs: |lse - ref| <= 2e-3 (merge 1e-4), -inf exactly where
the reference's is.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

NAN = float("nan")
OPS = ("gemm", "decode_attn", "merge_states", "flash_attn")
ALIASES = {"decode": "decode_attn", "merge": "merge_states", "flash": "flash_attn", "forward": "flash_attn",
           "attn": "flash_attn", "fwd": "flash_attn"}
DEFAULT_SEED = 19
DEFAULT_N = 120
QUICK_N = 24
#: distinct kernel configurations per op (full sweep, --quick); at ~2-5 s a compile (H200 host), the
#: full list compiles in well under two minutes on 12 processes, under six serially
BUDGET = {"gemm": 40, "decode_attn": 24, "merge_states": 8, "flash_attn": 28}
QUICK_BUDGET = {"gemm": 12, "decode_attn": 8, "merge_states": 3, "flash_attn": 8}

#: (rtol, atol, row_tol) per output dtype.  rtol: twice the unit roundoff of one rounding to the output
#: dtype (bf16 2^-8, fp16 2^-11; fp32 outputs are held to atol), times the magnitude of the terms (GEMM:
#: |alpha a b| + |beta c|; else |ref|).  atol, in units of a scale: GEMM the problem's typical magnitude
#: |alpha| sqrt(K) rms(a) rms(b) + |beta| rms(c) (room for the fp32 accumulation order and the split-K
#: reductions, as tests/_check.py); attention the element's own bound P @ |V| (rounding P to 16 bits moves
#: an output by at most 2^-8 (bf16) / 2^-11 (fp16) of it); merge sum w |o| / sum w.  row_tol: the relative
#: error allowed per row (see compare).
TOL = {
    "gemm": {"bfloat16": (2 ** -7, 2e-3, 0.02), "float16": (2 ** -10, 2e-3, 5e-3),
             "float32": (2 ** -20, 2e-3, 3e-3)},
    "attn": {"bfloat16": (2 ** -7, 2 ** -7, 0.03), "float16": (2 ** -10, 2 ** -9, 6e-3)},
    "merge": {"float32": (1e-5, 1e-5, 1e-4), "bfloat16": (2 ** -7, 1e-5, 0.02), "float16": (2 ** -10, 1e-5, 4e-3)},
}
LSE_TOL = {"attn": 2e-3, "merge": 1e-4}
ROW_FLOOR = 1e-2  # the row check's denominator: at least this fraction of the rms of the whole reference

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
ES = {"bfloat16": 2, "float16": 2, "float32": 4}


# ================================================================================================
# sizes
# ================================================================================================
def is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def near_tile(n: int, tiles) -> bool:
    """n is a multiple of a tile +- 1 (n > 2)."""
    return n > 2 and any((n + 1) % t == 0 or (n - 1) % t == 0 for t in tiles)


def loguniform(rng: random.Random, lo: int, hi: int) -> int:
    lo, hi = max(1, lo), max(1, hi)
    return max(lo, min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def prime_in(rng: random.Random, lo: int, hi: int) -> int:
    """A prime near a log-uniform draw in [lo, hi] (hi itself when there is none)."""
    v = loguniform(rng, max(lo, 2), hi)
    for d in range(0, hi):
        for c in (v - d, v + d):
            if lo <= c <= hi and is_prime(c):
                return c
    return hi


def size(rng: random.Random, lo: int, hi: int, tiles, p_tile: float = 0.35, p_prime: float = 0.2) -> int:
    """A size in [lo, hi]: a tile multiple +- 1 (or exact) with p_tile, a prime with p_prime, else
    log-uniform."""
    u = rng.random()
    if u < p_tile:
        t = rng.choice(tiles)
        if t <= hi:
            v = t * loguniform(rng, 1, max(1, hi // t)) + rng.choice((-1, -1, 0, 1, 1))
            return max(lo, min(hi, v))
    if u < p_tile + p_prime and hi >= 2:
        return prime_in(rng, lo, hi)
    return loguniform(rng, lo, hi)


# ================================================================================================
# case generators (pure Python: a case is a JSON-able dict; "seed" seeds its tensors)
# ================================================================================================
def gemm_case(m, n, k, **kw) -> dict:
    c = dict(op="gemm", m=m, n=n, k=k, batch=None, dtype="bfloat16", out_dtype=None, a_major="row",
             b_major="row", pad=False, ptr_off=0, alpha=1.0, beta=0.0, c_dtype=None, c_major="row",
             out_layout="row", choice=None, mcast=None, chain=False, seed=0)
    unknown = set(kw) - set(c)
    if unknown:
        raise ValueError(f"gemm_case: unknown keys {sorted(unknown)}")
    c.update(kw)
    return c


def gen_gemm(rng: random.Random) -> dict:
    tiles = (64, 128, 256)
    m, n, k = size(rng, 1, 4096, tiles), size(rng, 1, 4096, tiles), size(rng, 1, 4096, (64,))
    batch = rng.choice((2, 3, 4)) if rng.random() < 0.15 and m * n * k <= 1 << 31 else None
    dtype = "bfloat16" if rng.random() < 0.75 else "float16"
    u = rng.random()
    out_dtype = None if u < 0.75 else ("float32" if u < 0.9 else ("float16" if dtype == "bfloat16" else "bfloat16"))
    beta = rng.choice((0.5, -1.0)) if rng.random() < 0.2 else 0.0
    out_layout = rng.choice(("row",) * 9 + ("pad",) * 7 + ("col",) * 2 + ("odd",) * 2)
    choice = None
    if rng.random() < 0.08 and not batch:  # a forced split-K kernel (slices of >= 2 k-tiles)
        if rng.random() < 0.5:
            s = rng.choice((2, 3, 4, 8))
            if k >= 128 * s:
                choice = {"splitk_mode": "persistent", "splits": s}
                out_layout = rng.choice(("row", "pad"))
        elif k >= 256:
            choice = {"splitk_mode": "cluster", "splits": 2}
    c = gemm_case(
        m, n, k, batch=batch, dtype=dtype, out_dtype=out_dtype,
        a_major=rng.choice(("row", "col")), b_major=rng.choice(("row", "col")),
        pad=rng.random() < 0.6, ptr_off=1 if rng.random() < 0.05 else 0,
        alpha=rng.choice((1.0, 1.0, 0.5, -1.25)), beta=beta,
        c_dtype=(rng.choice((out_dtype or dtype, "float32")) if beta else None), c_major=rng.choice(("row", "col")),
        out_layout=out_layout, choice=choice, seed=rng.randrange(1 << 30))
    if choice is None and c["seed"] % 6 in (0, 3):  # misaligned operands staged / read in place, forced
        c["choice"] = {"stage": c["seed"] % 6 == 0}  # (PlanChoice.stage; no draw: the sequence stays)
    return c


def decode_case(b, sq, hq, hkv, d, lens, **kw) -> dict:
    c = dict(op="decode_attn", b=b, sq=sq, hq=hq, hkv=hkv, d=d, lens=list(lens), cap=max(1, max(lens)), page=0,
             splits=None, causal=True, dtype="bfloat16", load=None, qscale=1.0, seed=0)
    unknown = set(kw) - set(c)
    if unknown:
        raise ValueError(f"decode_case: unknown keys {sorted(unknown)}")
    c.update(kw)
    return c


def gen_decode(rng: random.Random) -> dict:
    d = rng.choice((64, 128, 128, 256))
    b = rng.choice((1, 1, 2, 3, 4, 5, 8))
    sq = rng.choice((1, 1, 1, 1, 2, 3, 4, 5, 7, 8, 13, 16))
    hkv = rng.choice((1, 2, 2, 4, 8))
    g = rng.choice((1, 2, 4, 4, 8))
    page = rng.choice((16, 32, 48, 64, 128, 256)) if rng.random() < 0.5 else 0
    tiles = (32, 64, 128) + ((page,) if page else ())
    hi = 8192
    while b * hkv * hi * d > 1 << 26 or g * hkv * hi * d > 1 << 26:  # keep the cache and the reference small
        hi //= 2
    lens = [0 if rng.random() < 0.05 else size(rng, 1, hi, tiles) for _ in range(b)]
    cap = max(1, max(lens)) + rng.choice((0, 0, 1, 17, 200))
    return decode_case(b, sq, g * hkv, hkv, d, lens, cap=cap, page=page,
                       splits=None if rng.random() < 0.4 else loguniform(rng, 1, 64),
                       causal=rng.random() < 0.7, dtype="bfloat16" if rng.random() < 0.75 else "float16",
                       load="cpasync" if not page and rng.random() < 0.1 else None,
                       qscale=4.0 if rng.random() < 0.2 else 1.0, seed=rng.randrange(1 << 30))


def merge_case(p, rows, d, **kw) -> dict:
    c = dict(op="merge_states", p=p, rows=list(rows), d=d, dtype="float32", p_empty=0.0, strided=False, seed=0)
    unknown = set(kw) - set(c)
    if unknown:
        raise ValueError(f"merge_case: unknown keys {sorted(unknown)}")
    c.update(kw)
    return c


def gen_merge(rng: random.Random) -> dict:
    p = size(rng, 1, 64, (4, 8, 16, 32))
    n = size(rng, 1, 4096, (4, 32, 128))
    d = rng.choice((64, 128, 128, 256, 32, 40, 80, 96, 512, 33))
    while p * n * d > 1 << 23:
        n = max(1, n // 2)
    rows = [n] if rng.random() < 0.6 else [rng.choice((2, 3)), n]
    return merge_case(p, rows, d, dtype=rng.choice(("float32", "float32", "bfloat16", "float16")),
                      p_empty=rng.choice((0.0, 0.0, 0.2, 0.5, 1.0)), strided=rng.random() < 0.25,
                      seed=rng.randrange(1 << 30))


def flash_case(b, sq, sk, hq, hkv, d, **kw) -> dict:
    c = dict(op="flash_attn", b=b, sq=sq, sk=sk, hq=hq, hkv=hkv, d=d, causal=False, dtype="bfloat16",
             layout="bshd", qscale=1.0, seed=0, window=None, lens=None, pad=0, page=0)
    unknown = set(kw) - set(c)
    if unknown:
        raise ValueError(f"flash_case: unknown keys {sorted(unknown)}")
    c.update(kw)
    return c


def gen_flash(rng: random.Random) -> dict:
    d = rng.choice((64, 96, 128, 256))
    b = rng.choice((1, 1, 2, 3))
    hkv = rng.choice((1, 1, 2, 3, 4))
    g = rng.choice((1, 1, 2, 4, 8))
    tiles = (64, 128, 192)
    sq, sk = size(rng, 1, 2048, tiles), size(rng, 1, 2048, tiles)
    while b * g * hkv * sq * sk > 1 << 24:  # attention work (and the reference's scores) stay small
        if b > 1:
            b -= 1
        elif g > 1:
            g //= 2
        elif sq >= sk:
            sq = (sq + 1) // 2
        else:
            sk = (sk + 1) // 2
    causal = rng.random() < 0.5
    kw = dict(causal=causal, dtype="bfloat16" if rng.random() < 0.7 else "float16",
              layout="bhsd" if rng.random() < 0.2 else "bshd", qscale=4.0 if rng.random() < 0.2 else 1.0,
              seed=rng.randrange(1 << 30))
    if rng.random() < 0.25:  # a sliding window (causal: right side 0), sides from 0 to past the length
        left = rng.choice((-1, 0, 1, rng.randrange(sk + 1), rng.randrange(2 * sk + 2)))
        right = 0 if causal else rng.choice((-1, 0, 1, rng.randrange(sk + 1)))
        if (left, right) != (-1, -1):
            kw["window"] = (left, right)
    if rng.random() < 0.3:  # packed sequences of up to (sq, sk) rows, empty and length-1 ones included
        n = rng.choice((1, 2, 3, 5, 8))
        lens = [[rng.choice((0, 1, rng.randrange(sq + 1), sq)), rng.choice((0, 1, rng.randrange(sk + 1), sk))]
                for _ in range(n)]
        kw.update(lens=lens, layout="bshd", pad=rng.choice((0, 1, 3)))
        b = n
        side = random.Random(kw["seed"])  # (its own stream: the other cases of a seed stay as they were)
        if side.random() < 0.4:  # the keys in a paged cache: shuffled pages, unused ones NaN
            kw["page"] = side.choice((16, 48, 64, 256))
    return flash_case(b, sq, sk, g * hkv, hkv, d, **kw)


GENERATORS = {"gemm": gen_gemm, "decode_attn": gen_decode, "merge_states": gen_merge, "flash_attn": gen_flash}


def candidates(op: str, seed: int):
    """The endless, deterministic stream of candidate cases of ``op`` for ``seed``."""
    rng = random.Random(f"{seed}/{op}")
    gen = GENERATORS[op]
    while True:
        yield gen(rng)


# ================================================================================================
# tensors: a (..., rows, cols) matrix in a larger buffer (GEMM operands and outputs)
# ================================================================================================
class Mat:
    """A (lead..., rows, cols) matrix of ``dtype`` stored ``major`` ("row": cols contiguous) with leading
    dimension ``ld`` >= the contiguous extent, starting ``off`` elements into a flat buffer.  The same
    view of a buffer on the meta device, the CPU or the GPU (bytes copied flat keep it)."""

    def __init__(self, dtype: str, lead: tuple, rows: int, cols: int, major: str = "row", ld: int | None = None,
                 off: int = 0):
        self.dtype, self.lead, self.rows, self.cols, self.major, self.off = dtype, tuple(lead), rows, cols, major, off
        self.ld = ld if ld is not None else self.inner

    @property
    def inner(self) -> int:
        return self.cols if self.major == "row" else self.rows

    @property
    def outer(self) -> int:
        return self.rows if self.major == "row" else self.cols

    @property
    def numel(self) -> int:
        return self.off + math.prod(self.lead) * self.outer * self.ld

    def view(self, base: torch.Tensor) -> torch.Tensor:
        t = base[self.off:].view(*self.lead, self.outer, self.ld)[..., : self.inner]
        return t if self.major == "row" else t.transpose(-1, -2)

    def alloc(self, device, gen=None, scale: float = 1.0) -> torch.Tensor:
        """The flat buffer: NaN everywhere, random normal values (times ``scale``) inside the view when
        ``gen`` is given (meta: uninitialized)."""
        dt = DT[self.dtype]
        if str(device) == "meta":
            return torch.empty(self.numel, dtype=dt, device="meta")
        base = torch.full((self.numel,), NAN, dtype=dt, device=device)
        if gen is not None:
            v = self.view(base)
            v.copy_(torch.randn(v.shape, generator=gen, device=device) * scale)
        return base


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def gemm_mats(c: dict) -> dict:
    """The Mat of a, b, out (and c, b2 where used) of a GEMM case."""
    lead = (c["batch"],) if c["batch"] else ()
    ab = c["dtype"]
    od = c["out_dtype"] or ab
    al = 16 // ES[ab]

    def operand(rows, cols, major):
        m = Mat(ab, lead, rows, cols, major, off=c["ptr_off"])
        if c["pad"]:
            m.ld = _round_up(m.inner, al) + (al if m.inner % al == 0 else 0)
        return m

    mats = {"a": operand(c["m"], c["k"], c["a_major"]), "b": operand(c["k"], c["n"], c["b_major"])}
    lay = c["out_layout"]
    oal = 16 // ES[od]
    if lay == "col":
        mats["out"] = Mat(od, lead, c["m"], c["n"], "col")
    elif lay == "pad":
        mats["out"] = Mat(od, lead, c["m"], c["n"], "row", ld=_round_up(c["n"], oal) + oal)
    elif lay == "odd":
        mats["out"] = Mat(od, lead, c["m"], c["n"], "row", ld=c["n"] + 1)
    else:
        mats["out"] = Mat(od, lead, c["m"], c["n"], "row")
    if c["beta"]:
        mats["c"] = Mat(c["c_dtype"] or od, lead, c["m"], c["n"], c["c_major"])
    if c["chain"]:
        mats["b2"] = Mat(ab, lead, c["n"], c["n"], "row")
        mats["out2"] = Mat(od, lead, c["m"], c["n"], "row")
    return mats


# ================================================================================================
# planning on the CPU: the kernels a case compiles
# ================================================================================================
def _ck():
    """Import the library (sets the DSL's target before cutlass loads; ~5 s the first time)."""
    import cute_kernels  # noqa: F401

    return cute_kernels


class _PatchedDecodeLoad:
    """``load="cpasync"`` for a contiguous cache: TMA_EF_MAX_KV_BYTES = 0 while planning and launching
    (the decode plan cache is cleared on entry and exit, so no other call keeps the forced load)."""

    def __init__(self, load):
        self.load = load

    def __enter__(self):
        if self.load == "cpasync":
            from cute_kernels.attention import decode_plan as DP

            self.prev = DP.TMA_EF_MAX_KV_BYTES
            DP.TMA_EF_MAX_KV_BYTES = 0
            DP._PLANS.clear()
        return self

    def __exit__(self, *exc):
        if self.load == "cpasync":
            from cute_kernels.attention import decode_plan as DP

            DP.TMA_EF_MAX_KV_BYTES = self.prev
            DP._PLANS.clear()


def _mcast_config(c: dict):
    """The split-K kernel of a ``mcast`` GEMM case: (kind, tile_n, splits, A-multicast CTAs) forced."""
    from cute_kernels.gemm import heuristics as GHe
    from cute_kernels.gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig

    kind, tn, s, mc = c["mcast"]
    ab, od = c["dtype"], c["out_dtype"] or c["dtype"]
    tiles = GHe.splitk_tiles(tn, ab, "k" if c["a_major"] == "row" else "mn", "mn" if c["b_major"] == "row" else "k",
                             od, mc)
    if kind == "cluster":
        return SplitKClusterConfig(tiles=tiles, splits=s, vec_store=True, b_evict_first=True)
    return SplitKFixupConfig(tiles=tiles, splits=s)


def plan_choice(c: dict):
    """The ``PlanChoice`` of a GEMM case's ``choice`` dict: PlanChoice's own fields, plus ``tile_m`` /
    ``tile_n`` / ``cluster`` for forced persistent-kernel tiles (``layouts.tiles.gemm_tiles``)."""
    from cute_kernels.gemm import heuristics as GHe
    from cute_kernels.gemm import plan as P

    if not c["choice"]:
        return P.DEFAULT_CHOICE
    kw = dict(c["choice"])
    tile = [kw.pop(x, None) for x in ("tile_m", "tile_n", "cluster")]
    if tile[1] is not None:
        kw["tiles"] = GHe.make_gemm_tiles(tile[1], tuple(tile[2] or (1, 1)), c["dtype"],
                                          "k" if c["a_major"] == "row" else "mn", "mn" if c["b_major"] == "row" else "k",
                                          c["out_dtype"] or c["dtype"], tile_m=tile[0] or 128)
    return P.PlanChoice(**kw)


def plan_case(c: dict) -> tuple[list, str]:
    """(compile keys ``[(kernel family, config), ...]``, a short description of the plan) of a case,
    from the real planners on meta tensors (no GPU, nothing compiled).  Raises what the op would
    raise for arguments it does not take."""
    _ck()
    from cute_kernels.common import jit

    op = c["op"]
    if op == "gemm":
        from cute_kernels.gemm import launch
        from cute_kernels.gemm import plan as P

        if c["mcast"]:
            cfg = _mcast_config(c)
            od = c["out_dtype"] or c["dtype"]
            return [(launch.FAMILY[type(cfg)], (cfg, c["dtype"], od, od))], f"forced {c['mcast'][0]} split-K mcast"
        mats = gemm_mats(c)
        t = {k: m.view(m.alloc("meta")) for k, m in mats.items()}
        choice = plan_choice(c)
        with jit.dry_run() as d:
            p = P.make_plan(t["a"], t["b"], t["out"], t.get("c"), c["beta"], None, choice, allow_cpu=True)
            if c["chain"]:
                P.make_plan(t["out"], t["b2"], t["out2"], None, 0.0, None, choice, allow_cpu=True)
        cfgs = [cfg for _, cfg in p.kernels]
        desc = p.kind
        if cfgs:
            cfg = cfgs[-1]
            if getattr(cfg, "mainloop", "tma") == "cpasync":
                desc += "/cpasync"
            desc += f" {cfg.tiles.tile_mnk[0]}x{cfg.tiles.tile_mnk[1]}"
            if cfg.tiles.cluster_mn != (1, 1):
                desc += " cl{}x{}".format(*cfg.tiles.cluster_mn)
            if cfg.splits > 1:
                desc += f" S{cfg.splits}"
            if getattr(cfg, "epi_defer", False):
                desc += " defer"
            if not getattr(cfg, "tma_store", True):
                desc += " direct-store"
        return list(dict.fromkeys(d.seen)), desc
    if op == "decode_attn":
        from cute_kernels.attention import decode_plan as DP

        q, k, bt = _decode_meta(c)
        with _PatchedDecodeLoad(c["load"]):
            cfg, splits = DP.plan_uncached(q, k, bt, c["splits"], c["causal"])
        return [("decode_attn", cfg)], f"{cfg.load} m{cfg.m_tile} n{cfg.n_tile} P{splits}"
    if op == "flash_attn":
        from cute_kernels.attention import forward as FW

        from cute_kernels.attention.forward_validate import check_window

        causal, window = check_window(tuple(c["window"] or (-1, -1)), c["causal"])
        cfg = FW.plan(DT[c["dtype"]], c["d"], causal, varlen=c["lens"] is not None, window=window is not None,
                      page_size=c.get("page", 0))
        desc = f"tile {cfg.tile.tile_m}x{cfg.tile.tile_n}"
        desc += " varlen" if c["lens"] is not None else ""
        desc += f" paged{c['page']}" if c.get("page") else ""
        desc += " window" if window is not None else ""
        return [("flash_attn_fwd", cfg)], desc
    if op == "merge_states":
        from cute_kernels.attention.merge import MergeConfig

        if (c["d"] * ES[c["dtype"]]) % 16:
            return [], "torch (rows not 16-byte multiples)"
        return [("merge_states", MergeConfig(c["dtype"], c["dtype"], c["d"]))], "kernel"
    raise ValueError(f"unknown op {op!r}")


def _decode_meta(c: dict):
    dt = DT[c["dtype"]]
    q = torch.empty(c["b"], c["sq"], c["hq"], c["d"], dtype=dt, device="meta")
    if c["page"]:
        pps = -(-c["cap"] // c["page"])
        k = torch.empty(c["b"] * pps + 3, c["page"], c["hkv"], c["d"], dtype=dt, device="meta")
        bt = torch.empty(c["b"], pps, dtype=torch.int32, device="meta")
    else:
        k = torch.empty(c["b"], c["cap"], c["hkv"], c["d"], dtype=dt, device="meta")
        bt = None
    return q, k, bt


def select_cases(op: str, n: int, seed: int, budget: int, max_tries: int = 200) -> tuple[list, list]:
    """The first ``n`` candidates of ``op`` (seeded) whose kernels fit the budget: a candidate needing a
    configuration not seen yet is taken while the distinct configurations stay within
    ``budget * (taken + 1) / n + budget / 4`` (new kernels spread over the list); ones the op rejects
    are skipped.
    Returns (cases, distinct keys); each case gets ``id``, ``plan`` and ``keys`` (indices into the keys)."""
    keys: dict = {}
    cases = []
    stream = candidates(op, seed)
    for _ in range(n * max_tries):
        c = next(stream)
        try:
            ks, desc = plan_case(c)
        except (ValueError, TypeError, AssertionError):
            continue
        new = [k for k in ks if k not in keys]
        allowed = min(budget, math.ceil(budget * (len(cases) + 1) / n) + budget // 4)
        if new and len(keys) + len(new) > max(1, allowed):
            continue
        for k in new:
            keys[k] = len(keys)
        c["plan"] = desc
        c["keys"] = [keys[k] for k in ks]
        cases.append(c)
        if len(cases) == n:
            break
    for i, c in enumerate(cases):
        c["id"] = f"{op}#{i}"
    return cases, list(keys)


def case_name(c: dict) -> str:
    """One-line description of a case's shape and options."""
    op = c["op"]
    if op == "gemm":
        s = f"{c['batch']}x" if c["batch"] else ""
        s += f"{c['m']}x{c['n']}x{c['k']} {SHORT[c['dtype']]}"
        if c["out_dtype"]:
            s += f">{SHORT[c['out_dtype']]}"
        s += f" {c['a_major'][0]}{c['b_major'][0]}"
        s += " pad" if c["pad"] else ""
        s += f" off{c['ptr_off']}" if c["ptr_off"] else ""
        if c["beta"]:
            s += f" a{c['alpha']:g} b{c['beta']:g} C:{SHORT.get(c['c_dtype'], '')}/{c['c_major'][0]}"
        elif c["alpha"] != 1.0:
            s += f" a{c['alpha']:g}"
        s += f" out:{c['out_layout']}" if c["out_layout"] != "row" else ""
        if c["choice"]:
            s += " " + ",".join(f"{k}={v}" for k, v in c["choice"].items())
        if c["mcast"]:
            s += " mcast=" + ":".join(map(str, c["mcast"]))
        s += " +chain" if c["chain"] else ""
        return s
    if op == "decode_attn":
        lens = c["lens"] if len(c["lens"]) <= 4 else c["lens"][:3] + ["..."]
        s = (f"b{c['b']} sq{c['sq']} hq{c['hq']}/{c['hkv']} d{c['d']} L{lens} cap{c['cap']} "
             f"{'page' + str(c['page']) if c['page'] else 'contig'} splits={c['splits']} "
             f"{'causal' if c['causal'] else 'full'} {SHORT[c['dtype']]}")
        s += f" load={c['load']}" if c["load"] else ""
        return s + (f" q*{c['qscale']:g}" if c["qscale"] != 1.0 else "")
    if op == "merge_states":
        return (f"P{c['p']} rows{c['rows']} d{c['d']} {SHORT[c['dtype']]} empty{c['p_empty']:g}"
                + (" strided" if c["strided"] else ""))
    s = (f"b{c['b']} sq{c['sq']} sk{c['sk']} hq{c['hq']}/{c['hkv']} d{c['d']} "
         f"{'causal' if c['causal'] else 'full'} {SHORT[c['dtype']]}")
    s += " bhsd" if c["layout"] == "bhsd" else ""
    if c.get("window"):
        s += " window({},{})".format(*c["window"])
    if c.get("lens") is not None:
        lens = c["lens"] if len(c["lens"]) <= 3 else c["lens"][:3] + ["..."]
        s += f" packed{lens}" + (f" pad{c['pad']}" if c["pad"] else "")
        s += f" pages of {c['page']}" if c.get("page") else ""
    return s + (f" q*{c['qscale']:g}" if c["qscale"] != 1.0 else "")


# ================================================================================================
# compiling ahead (parallel processes, into the disk cache)
# ================================================================================================
def compile_key(key) -> str:
    """Compile (or load) one ``(family, config)`` key; "" or an error line.  Module level: the worker of
    the spawned compile processes."""
    name, cfg = key
    try:
        _ck()
        if name.startswith("gemm"):
            from cute_kernels.gemm import launch

            launch.compiled(*cfg)
        elif name == "decode_attn":
            from cute_kernels.attention import decode as DA

            DA.get_decode_kernel(cfg)
        elif name == "flash_attn_fwd":
            from cute_kernels.attention import forward as FW

            FW.get_forward_kernel(cfg)
        elif name == "merge_states":
            from cute_kernels.attention import merge as M

            M.get_merge_kernel(cfg)
        else:
            return f"{name}: unknown kernel family"
        return ""
    except Exception as e:  # noqa: BLE001 - reported, and raised again by the case that runs it
        return f"{name} {str(cfg)[:160]}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def precompile(keys: list, processes: int) -> tuple[float, list]:
    """Compile ``keys`` in ``processes`` spawned processes (0 / 1: here, serially); (seconds, errors)."""
    from cute_kernels.common import jit

    t0 = time.perf_counter()
    keys = list(dict.fromkeys(keys))
    if processes <= 1:
        errors = [e for e in map(compile_key, keys) if e]
    else:
        errors = jit.precompile_in_processes(compile_key, keys, processes)
    return time.perf_counter() - t0, errors


def default_jobs() -> int:
    return max(1, min(12, (os.cpu_count() or 2) - 2))


# ================================================================================================
# the check
# ================================================================================================
def _safe_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num / den where den > 0; where den == 0: 0 if num == 0 else inf."""
    zero = torch.zeros_like(num)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.where(num > 0, torch.full_like(num, math.inf), zero))


def compare(out: torch.Tensor, ref: torch.Tensor, *, rtol: float, atol: float, row_tol: float, mag=None,
            scale=None, rows=((-1, -2),)) -> dict:
    """Elementwise and per-row check of ``out`` against ``ref`` (same shape; compared in ref's dtype).

    Elementwise: ``|out - ref| <= rtol * mag + atol * scale``; ``mag`` (per element) defaults to |ref|,
    ``scale`` (a number or per element) to the rms of ref.  Rows: for each ``(vec_dim, tail_dim)`` in
    ``rows``, the vectors along ``vec_dim`` (GEMM: rows and columns; attention: head-dim vectors) must
    have ``||d|| <= row_tol * max(||ref||, ROW_FLOOR * rms(ref) * sqrt(len))``, which a whole wrong or
    zeroed row fails even where the elementwise bound is loose; the vectors at the last index of
    ``tail_dim`` are the tail.  Non-finite values where ref is finite fail.  Returns the normalized
    errors (<= 1 passes): ``err`` (the worst), ``elem``, ``row``, ``tail``, and ``nonfinite`` (count) and
    ``ok``."""
    out = out.to(ref.dtype)
    if ref.numel() == 0:
        return dict(ok=True, err=0.0, elem=0.0, row=0.0, tail=0.0, nonfinite=0)
    fin = torch.isfinite(ref)
    bad = ~torch.isfinite(out) & fin
    nonfinite = int(bad.sum())
    r = torch.where(fin, ref, torch.zeros_like(ref))
    d = torch.where(fin, (out - ref).abs(), torch.zeros_like(ref))
    d = torch.where(bad, torch.full_like(d, math.inf), d)
    rms = r.square().mean().sqrt()
    mag = r.abs() if mag is None else mag.to(ref.dtype)
    scale = rms if scale is None else (scale.to(ref.dtype) if isinstance(scale, torch.Tensor) else scale)
    elem = _safe_ratio(d, rtol * mag + atol * scale).max().item()
    row = tail = 0.0
    for vec_dim, tail_dim in rows:
        n = ref.shape[vec_dim]
        dn = torch.linalg.vector_norm(d, dim=vec_dim, keepdim=True)
        rn = torch.linalg.vector_norm(r, dim=vec_dim, keepdim=True)
        e = _safe_ratio(dn, row_tol * torch.clamp(rn, min=float(ROW_FLOOR * rms * math.sqrt(n))))
        row = max(row, e.max().item())
        tail = max(tail, e.select(tail_dim, -1).max().item())
    err = max(elem, row)
    return dict(ok=bool(err <= 1.0 and nonfinite == 0), err=err, elem=elem, row=row, tail=tail, nonfinite=nonfinite)


def compare_lse(lse: torch.Tensor, ref: torch.Tensor, tol: float) -> float:
    """Normalized LSE error: max |lse - ref| / tol over finite reference entries; inf when the -inf
    pattern differs or a NaN appears."""
    lse = lse.to(ref.dtype)
    empty = torch.isneginf(ref)
    if torch.isnan(lse).any() or not torch.equal(torch.isneginf(lse), empty):
        return math.inf
    if (~empty).sum() == 0:
        return 0.0
    return ((lse[~empty] - ref[~empty]).abs().max() / tol).item()


def guard_ok(base: torch.Tensor, mat: Mat) -> bool:
    """Everything in ``base`` outside ``mat``'s view is still NaN (nothing written past the view)."""
    return guard_report(base, mat) is None


def guard_report(base: torch.Tensor, mat: Mat) -> str | None:
    """None when nothing outside ``mat``'s view of ``base`` was written (still NaN); else where: the
    count, and the first few written positions as (outer index, inner index) in the ``ld`` rows with
    their values, so a store past the row's end shows as inner >= ``mat.inner``."""
    inside = torch.zeros(base.numel(), dtype=torch.bool, device=base.device)
    mat.view(inside).fill_(True)
    written = (~inside) & ~torch.isnan(base)
    n = int(written.sum())
    if n == 0:
        return None
    idx = written.nonzero().flatten()[:6].tolist()
    where = []
    for i in idx:
        j = i - mat.off
        where.append(f"[{j // mat.ld},{j % mat.ld}]={base[i].item():.3g}" if j >= 0 else f"[pre {i}]={base[i].item():.3g}")
    return (f"wrote {n} elements outside the out view ({mat.major}-major, inner {mat.inner}, ld {mat.ld}): "
            + " ".join(where))


# ================================================================================================
# references
# ================================================================================================
def gemm_ref(a, b, alpha=1.0, beta=0.0, c=None):
    """float64 (ref, mag, scale) of ``alpha * a @ b + beta * c``: mag = |alpha a b| + |beta c| per element,
    scale = |alpha| sqrt(K) rms(a) rms(b) + |beta| rms(c) (the problem's typical output magnitude)."""
    def rms(t):
        return t.double().square().mean().sqrt().item() if t.numel() else 0.0

    ab = alpha * (a.double() @ b.double())
    scale = abs(alpha) * math.sqrt(max(1, a.shape[-1])) * rms(a) * rms(b)
    if c is None or not beta:
        return ab, ab.abs(), scale
    bc = beta * c.double()
    return ab + bc, ab.abs() + bc.abs(), scale + abs(beta) * rms(c)


def attn_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, window=None):
    """float32 attention of one sequence: q (Sq, Hq, D), k / v (L, Hkv, D); bottom-right causal (query
    i sees keys j <= i + L - Sq), GQA (query head h reads K/V head h // (Hq / Hkv)).  Returns o (Sq, Hq,
    D), |V|-weighted bound o_abs = P @ |V| (same shape) and lse (Hq, Sq); rows that see no key: 0 and -inf.
    ``window`` (left, right), -1 unbounded: query i (at p = i + L - Sq) sees keys p - left .. p + right
    (causal: right 0)."""
    Sq, Hq, D = q.shape
    L, Hkv = k.shape[0], k.shape[1]
    G = Hq // Hkv
    o = torch.zeros(Sq, Hq, D, dtype=torch.float32, device=q.device)
    o_abs = torch.zeros_like(o)
    lse = torch.full((Hq, Sq), -math.inf, dtype=torch.float32, device=q.device)
    if L == 0 or Sq == 0:
        return o, o_abs, lse
    mask = None
    left, right = window or (-1, -1)
    right = 0 if causal else right
    pos = torch.arange(Sq, device=q.device)[:, None] + (L - Sq)
    keys = torch.arange(L, device=q.device)[None, :]
    if right >= 0:
        mask = keys > pos + right
    if left >= 0:
        mask = (keys < pos - left) if mask is None else mask | (keys < pos - left)
    step = max(1, (1 << 25) // max(1, G * Sq * L))  # KV heads per chunk: scores stay <= 32M floats
    qf = q.float().view(Sq, Hkv, G, D)
    for h0 in range(0, Hkv, step):
        h1 = min(Hkv, h0 + step)
        kf = k[:, h0:h1].float().transpose(0, 1)  # (h, L, D)
        vf = v[:, h0:h1].float().transpose(0, 1)
        qh = qf[:, h0:h1].permute(1, 2, 0, 3).reshape(h1 - h0, G * Sq, D)  # rows g * Sq + t
        s = torch.bmm(qh, kf.transpose(1, 2)).view(h1 - h0, G, Sq, L) * scale
        if mask is not None:
            s = s.masked_fill(mask, -math.inf)
        l = torch.logsumexp(s, dim=-1)  # (h, G, Sq)
        empty = torch.isneginf(l)
        p = torch.exp(s - torch.where(empty, torch.zeros_like(l), l)[..., None])
        p = torch.where(empty[..., None], torch.zeros_like(p), p).view(h1 - h0, G * Sq, L)
        oh = torch.bmm(p, vf).view(h1 - h0, G, Sq, D)
        ah = torch.bmm(p, vf.abs()).view(h1 - h0, G, Sq, D)
        o[:, h0 * G:h1 * G] = oh.permute(2, 0, 1, 3).reshape(Sq, (h1 - h0) * G, D)
        o_abs[:, h0 * G:h1 * G] = ah.permute(2, 0, 1, 3).reshape(Sq, (h1 - h0) * G, D)
        lse[h0 * G:h1 * G] = l.reshape((h1 - h0) * G, Sq)
    return o, o_abs, lse


def merge_ref(o_parts: torch.Tensor, lse_parts: torch.Tensor):
    """float64 merge: (o, o_abs = sum w |o| / sum w, lse); empty parts (lse -inf) ignored, NaN o included."""
    lse = lse_parts.double()
    o = o_parts.double()
    m = lse.amax(dim=0)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp(lse - m[None])
    live = (w > 0)[..., None]
    zero = torch.zeros_like(o)
    ws = w.sum(dim=0)
    acc = torch.where(live, w[..., None] * o, zero).sum(dim=0)
    acc_abs = torch.where(live, w[..., None] * o.abs(), zero).sum(dim=0)
    inv = torch.where(ws > 0, 1.0 / torch.where(ws > 0, ws, torch.ones_like(ws)), torch.zeros_like(ws))
    return acc * inv[..., None], acc_abs * inv[..., None], m + torch.log(ws)


# ================================================================================================
# runners: one case on the GPU; tensors are drawn (and references computed) on ``ref_dev``
# ================================================================================================
def _gen(dev, seed: int) -> torch.Generator:
    return torch.Generator(device=dev).manual_seed(seed)


#: where the ops run ("cpu" only in the CPU self-tests, with stand-ins for the GPU-only ops)
RUN_DEV = "cuda"


def _sync():
    if RUN_DEV == "cuda":
        torch.cuda.synchronize()


def _merge_results(*rs: dict) -> dict:
    out = dict(ok=all(r["ok"] for r in rs), err=max(r["err"] for r in rs), tail=max(r["tail"] for r in rs),
               nonfinite=sum(r["nonfinite"] for r in rs))
    return out


def run_gemm(c: dict, ref_dev: str = "cuda") -> dict:
    ck = _ck()
    from cute_kernels.gemm import plan as P

    g = _gen(ref_dev, c["seed"])
    mats = gemm_mats(c)
    host = {}
    for name in ("a", "b", "c", "b2"):
        if name in mats:
            host[name] = mats[name].alloc(ref_dev, g, scale=0.25 if name == "b2" else 1.0)
    dev = {name: t.to(RUN_DEV) for name, t in host.items()}
    obase = mats["out"].alloc(RUN_DEV)  # NaN
    v = {name: mats[name].view(t) for name, t in dev.items()}
    out = mats["out"].view(obase)
    alpha, beta = c["alpha"], c["beta"]
    if c["mcast"]:
        from cute_kernels.gemm import launch as GL
        from cute_kernels.gemm.splitk_kernel import fixup_workspace_numel

        cfg = _mcast_config(c)
        od = c["out_dtype"] or c["dtype"]
        fn = GL.compiled(cfg, c["dtype"], od, od)
        if c["mcast"][0] != "cluster":
            fn = GL.WorkspaceLauncher(fn, *fixup_workspace_numel(c["m"], c["n"], c["mcast"][1], c["mcast"][2]))
        fn(v["a"], v["b"], out, out, float(alpha), 0.0)
    elif c["choice"]:
        P.run(v["a"], v["b"], out, v.get("c"), alpha, beta, None, choice=plan_choice(c))
    else:
        ck.gemm(v["a"], v["b"], out=out, alpha=alpha, beta=beta, c=v.get("c"))
    out2 = obase2 = None
    if c["chain"]:  # back to back (PDL): the second GEMM reads the first's output
        obase2 = mats["out2"].alloc(RUN_DEV)
        out2 = mats["out2"].view(obase2)
        P.run(out, v["b2"], out2, None, 1.0, 0.0, None, choice=plan_choice(c))
    _sync()
    hv = {name: mats[name].view(t) for name, t in host.items()}
    ref, mag, scale = gemm_ref(hv["a"], hv["b"], alpha, beta, hv.get("c"))
    tol = TOL["gemm"][c["out_dtype"] or c["dtype"]]
    rows = ((-1, -2), (-2, -1))  # rows (tail: the last row) and columns (tail: the last column)
    res = compare(out.to(ref_dev), ref, rtol=tol[0], atol=tol[1], row_tol=tol[2], mag=mag, scale=scale, rows=rows)
    if c["chain"]:
        ref2, mag2, scale2 = gemm_ref(out.to(ref_dev), hv["b2"])
        res = _merge_results(res, compare(out2.to(ref_dev), ref2, rtol=tol[0], atol=tol[1], row_tol=tol[2],
                                          mag=mag2, scale=scale2, rows=rows))
    bad = guard_report(obase, mats["out"]) or (obase2 is not None and guard_report(obase2, mats["out2"]))
    if bad:
        res.update(ok=False, msg=bad)
    return res


def run_decode(c: dict, ref_dev: str = "cuda") -> dict:
    ck = _ck()
    from cute_kernels.attention import decode as DA
    from cute_kernels.attention import decode_plan as DP

    dt = DT[c["dtype"]]
    g = _gen(ref_dev, c["seed"])
    B, Sq, Hq, Hkv, D = c["b"], c["sq"], c["hq"], c["hkv"], c["d"]
    q = (torch.randn(B, Sq, Hq, D, generator=g, device=ref_dev) * c["qscale"]).to(dt)
    bt = None
    if c["page"]:
        ps = c["page"]
        pps = -(-c["cap"] // ps)
        n_pages = B * pps + 3
        k = torch.randn(n_pages, ps, Hkv, D, generator=g, device=ref_dev).to(dt)
        v = torch.randn(n_pages, ps, Hkv, D, generator=g, device=ref_dev).to(dt)
        bt = torch.randperm(n_pages, generator=g, device=ref_dev)[: B * pps].view(B, pps).to(torch.int32)
    else:
        k = torch.randn(B, c["cap"], Hkv, D, generator=g, device=ref_dev).to(dt)
        v = torch.randn(B, c["cap"], Hkv, D, generator=g, device=ref_dev).to(dt)
    lens = torch.tensor(c["lens"], dtype=torch.int32)
    qd, kd, vd, ld = q.to(RUN_DEV), k.to(RUN_DEV), v.to(RUN_DEV), lens.to(RUN_DEV)
    btd = bt.to(RUN_DEV).contiguous() if bt is not None else None
    out = torch.full((B, Sq, Hq, D), NAN, dtype=dt, device=RUN_DEV)
    with _PatchedDecodeLoad(c["load"]):
        P = DP.plan(qd, kd, btd, c["splits"], c["causal"])[1]
        ws = DA.decode_attn_workspace(qd, P).fill_(NAN) if P > 1 else None
        o, lse = ck.decode_attn(qd, kd, vd, cache_seqlens=ld, block_table=btd, num_splits=c["splits"],
                                causal=c["causal"], return_lse=True, out=out, workspace=ws)
    _sync()
    ref = torch.zeros(B, Sq, Hq, D, device=ref_dev)
    ref_abs = torch.zeros_like(ref)
    ref_lse = torch.full((B, Hq, Sq), -math.inf, device=ref_dev)
    for b, L in enumerate(c["lens"]):
        if c["page"]:
            pages = bt[b, : -(-L // c["page"])].long()
            kb, vb = k[pages].reshape(-1, Hkv, D)[:L], v[pages].reshape(-1, Hkv, D)[:L]
        else:
            kb, vb = k[b, :L], v[b, :L]
        ref[b], ref_abs[b], ref_lse[b] = attn_ref(q[b], kb, vb, c["causal"], D ** -0.5)
    tol = TOL["attn"][c["dtype"]]
    res = compare(o.to(ref_dev), ref, rtol=tol[0], atol=tol[1], row_tol=tol[2], scale=ref_abs, rows=((-1, 1),))
    res["lse"] = compare_lse(lse.to(ref_dev), ref_lse, LSE_TOL["attn"])
    res["splits"] = P
    return res


def run_flash(c: dict, ref_dev: str = "cuda") -> dict:
    if c.get("lens") is not None:
        return run_flash_packed(c, ref_dev)
    ck = _ck()
    dt = DT[c["dtype"]]
    g = _gen(ref_dev, c["seed"])
    B, Sq, Sk, Hq, Hkv, D = c["b"], c["sq"], c["sk"], c["hq"], c["hkv"], c["d"]
    bhsd = c["layout"] == "bhsd"

    def make(S, H, scale=1.0):
        if bhsd:  # (B, H, S, D) storage viewed as (B, S, H, D)
            return (torch.randn(B, H, S, D, generator=g, device=ref_dev) * scale).to(dt).transpose(1, 2)
        return (torch.randn(B, S, H, D, generator=g, device=ref_dev) * scale).to(dt)

    def to_dev(t):  # the same strides on the GPU
        return t.transpose(1, 2).to(RUN_DEV).transpose(1, 2) if bhsd else t.to(RUN_DEV)

    q, k, v = make(Sq, Hq, c["qscale"]), make(Sk, Hkv), make(Sk, Hkv)
    qd, kd, vd = to_dev(q), to_dev(k), to_dev(v)
    out = torch.full((B, Hq, Sq, D) if bhsd else (B, Sq, Hq, D), NAN, dtype=dt, device=RUN_DEV)
    out = out.transpose(1, 2) if bhsd else out
    window = tuple(c["window"]) if c.get("window") else None
    o, lse = ck.flash_attn(qd, kd, vd, causal=c["causal"], out=out, return_lse=True, window_size=window or (-1, -1))
    _sync()
    ref = torch.zeros(B, Sq, Hq, D, device=ref_dev)
    ref_abs = torch.zeros_like(ref)
    ref_lse = torch.full((B, Hq, Sq), -math.inf, device=ref_dev)
    for b in range(B):
        ref[b], ref_abs[b], ref_lse[b] = attn_ref(q[b], k[b], v[b], c["causal"], D ** -0.5, window)
    tol = TOL["attn"][c["dtype"]]
    res = compare(o.to(ref_dev), ref, rtol=tol[0], atol=tol[1], row_tol=tol[2], scale=ref_abs, rows=((-1, 1),))
    res["lse"] = compare_lse(lse.to(ref_dev), ref_lse, LSE_TOL["attn"])
    if o is not out:
        res.update(ok=False, msg="did not return out")
    return res


def run_flash_packed(c: dict, ref_dev: str = "cuda") -> dict:
    """A packed (variable-length) batch: sequences of ``c["lens"]`` (query, key) rows back to back,
    ``c["pad"]`` rows after the last one that belong to no sequence (NaN-poisoned in out: never
    written); each sequence against its own float32 reference.  ``c["page"]``: the keys in a paged
    cache instead (:func:`paged_pools`), q still packed."""
    ck = _ck()
    dt = DT[c["dtype"]]
    g = _gen(ref_dev, c["seed"])
    Hq, Hkv, D, pad = c["hq"], c["hkv"], c["d"], c["pad"]
    lq, lk = [a for a, _ in c["lens"]], [b for _, b in c["lens"]]
    cu_q = [0] + list(itertools.accumulate(lq))
    cu_k = [0] + list(itertools.accumulate(lk))
    tq, tk = cu_q[-1] + pad, cu_k[-1] + pad
    q = (torch.randn(tq, Hq, D, generator=g, device=ref_dev) * c["qscale"]).to(dt)
    k = torch.randn(tk, Hkv, D, generator=g, device=ref_dev).to(dt)
    v = torch.randn(tk, Hkv, D, generator=g, device=ref_dev).to(dt)
    window = tuple(c["window"]) if c.get("window") else None
    out = torch.full((tq, Hq, D), NAN, dtype=dt, device=RUN_DEV)
    i32 = dict(dtype=torch.int32, device=RUN_DEV)
    kv = dict(cu_seqlens_k=torch.tensor(cu_k, **i32), max_seqlen_k=max(lk))
    kd, vd = k.to(RUN_DEV), v.to(RUN_DEV)
    if c.get("page"):
        kd, vd, bt = paged_pools(k, v, cu_k, c["page"], g)
        kv = dict(block_table=bt, seqused_k=torch.tensor(lk, **i32))
    o, lse = ck.flash_attn(q.to(RUN_DEV), kd, vd, causal=c["causal"], out=out, return_lse=True,
                           cu_seqlens_q=torch.tensor(cu_q, **i32), max_seqlen_q=max(lq),
                           window_size=window or (-1, -1), **kv)
    _sync()
    n = cu_q[-1]
    ref = torch.zeros(n, Hq, D, device=ref_dev)
    ref_abs = torch.zeros_like(ref)
    ref_lse = torch.full((Hq, n), -math.inf, device=ref_dev)
    for b in range(len(lq)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        ref[rq], ref_abs[rq], ref_lse[:, rq] = attn_ref(q[rq], k[rk], v[rk], c["causal"], D ** -0.5, window)
    tol = TOL["attn"][c["dtype"]]
    res = compare(o[:n].to(ref_dev), ref, rtol=tol[0], atol=tol[1], row_tol=tol[2], scale=ref_abs, rows=((-1, 0),))
    res["lse"] = compare_lse(lse[:, :n].to(ref_dev), ref_lse, LSE_TOL["attn"])
    if o is not out:
        res.update(ok=False, msg="did not return out")
    elif pad and not torch.isnan(out[n:]).all():
        res.update(ok=False, msg=f"wrote {int((~torch.isnan(out[n:])).sum())} elements into the {pad} rows past the sequences")
    return res


def paged_pools(k, v, cu_k, page, g):
    """Packed keys (total_k, Hkv, D) as page pools on the run device: each sequence's rows in
    shuffled pages (pages 0 and last never used, NaN like every unused page; rows of a last page
    past its length 0), the block table's unused entries -1 (never read).  Returns (k, v, table)."""
    lk = [b - a for a, b in zip(cu_k[:-1], cu_k[1:])]
    need = [-(-n // page) for n in lk]
    num = sum(need) + 2
    order = (1 + torch.randperm(num - 2, generator=g, device=g.device)).tolist()
    pools = [torch.full((num, page) + tuple(k.shape[1:]), NAN, dtype=k.dtype, device=k.device) for _ in (k, v)]
    table = torch.full((len(lk), max(need + [1])), -1, dtype=torch.int32)
    nxt = 0
    for b, n in enumerate(lk):
        for p in range(need[b]):
            pid, rows = order[nxt], slice(cu_k[b] + p * page, cu_k[b] + min((p + 1) * page, n))
            nxt += 1
            table[b, p] = pid
            for pool, src in zip(pools, (k, v)):
                pool[pid].zero_()
                pool[pid, : rows.stop - rows.start] = src[rows]
    return pools[0].to(RUN_DEV), pools[1].to(RUN_DEV), table.to(RUN_DEV)


def run_merge(c: dict, ref_dev: str = "cuda") -> dict:
    ck = _ck()
    dt = DT[c["dtype"]]
    g = _gen(ref_dev, c["seed"])
    P, rows, D = c["p"], tuple(c["rows"]), c["d"]
    o = torch.randn(P, *rows, D, generator=g, device=ref_dev)
    lse = torch.randn(P, *rows, generator=g, device=ref_dev) * 3
    empty = torch.rand(P, *rows, generator=g, device=ref_dev) < c["p_empty"]
    lse = torch.where(empty, torch.full_like(lse, -math.inf), lse)
    o = torch.where(empty[..., None], torch.full_like(o, NAN), o).to(dt)  # empty parts' o: NaN (ignored)
    if c["strided"]:  # (rows..., P, D) storage viewed as (P, rows..., D)
        od = o.movedim(0, -2).contiguous().to(RUN_DEV).movedim(-2, 0)
    else:
        od = o.contiguous().to(RUN_DEV)
    lsed = lse.to(RUN_DEV)
    n = math.prod(rows)
    # no out=: fill the allocator's free blocks of the outputs' sizes with NaN, so an unwritten element
    # of the (likely reused) block shows
    junk = [torch.full((n * D,), NAN, dtype=dt, device=RUN_DEV) for _ in range(3)]
    junk += [torch.full((n,), NAN, dtype=torch.float32, device=RUN_DEV) for _ in range(3)]
    del junk
    om, lm = ck.merge_states(od, lsed)
    _sync()
    ref, ref_abs, ref_lse = merge_ref(o, lse)
    tol = TOL["merge"][c["dtype"]]
    res = compare(om.to(ref_dev), ref, rtol=tol[0], atol=tol[1], row_tol=tol[2], scale=ref_abs,
                  rows=((-1, -2),) if len(rows) else ())
    res["lse"] = compare_lse(lm.to(ref_dev), ref_lse, LSE_TOL["merge"])
    return res


RUNNERS = {"gemm": run_gemm, "decode_attn": run_decode, "merge_states": run_merge, "flash_attn": run_flash}


def run_case(c: dict, ref_dev: str = "cuda") -> dict:
    """Run one case; never raises: an exception is a failed case with its message."""
    t0 = time.perf_counter()
    try:
        r = RUNNERS[c["op"]](c, ref_dev)
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        r = dict(ok=False, err=math.inf, tail=math.inf, nonfinite=0,
                 msg=f"{type(e).__name__}: {msg[0] if msg else ''}"[:300])
    lse = r.get("lse")
    if lse is not None and not lse <= 1.0:
        r["ok"] = False
    r["ms"] = (time.perf_counter() - t0) * 1e3
    return r


def fmt_err(x) -> str:
    return "-" if x is None else ("inf" if x == math.inf else f"{x:.3f}")


def case_line(c: dict, r: dict) -> str:
    status = "ok" if r["ok"] else "FAIL"
    s = (f"{c.get('id', c['op']):<18} {status:<4} err {fmt_err(r.get('err')):>7} tail {fmt_err(r.get('tail')):>7} "
         f"lse {fmt_err(r.get('lse')):>7}  {case_name(c)}  [{c.get('plan', '')}]  {r['ms']:.0f} ms")
    if r.get("nonfinite"):
        s += f"  nonfinite={r['nonfinite']}"
    if r.get("msg"):
        s += f"  {r['msg']}"
    return s


def summarize(cases: list, results: list) -> dict:
    """Per op: count, failures, worst normalized error (and its case)."""
    out = {}
    for c, r in zip(cases, results):
        s = out.setdefault(c["op"], dict(count=0, failures=0, worst_err=0.0, worst_case=None, failed=[]))
        s["count"] += 1
        e = max(r.get("err") or 0.0, r.get("lse") or 0.0)
        if e != e:  # NaN: the worst there is
            e = math.inf
        if not r["ok"]:
            s["failures"] += 1
            s["failed"].append(c.get("id"))
        if e >= s["worst_err"]:
            s["worst_err"], s["worst_case"] = e, c.get("id")
    return out


def summary_lines(summary: dict) -> list[str]:
    return [f"{op:<13} {s['count']:4d} cases  {s['failures']:3d} failed  worst normalized error "
            f"{fmt_err(s['worst_err'])} ({s['worst_case']})" + (f"  failed: {s['failed'][:12]}" if s["failed"] else "")
            for op, s in summary.items()]


def parse_ops(text: str) -> list[str]:
    ops = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        name = ALIASES.get(name, name)
        if name not in OPS:
            raise argparse.ArgumentTypeError(f"unknown op {name!r}: one of {', '.join(OPS)} "
                                             f"(or {', '.join(ALIASES)})")
        if name not in ops:
            ops.append(name)
    return ops


def commit_name() -> str:
    try:
        from cute_kernels.tools.bench.results import commit_name as cn

        return cn(ROOT)
    except Exception:  # noqa: BLE001
        return os.environ.get("CK_COMMIT") or "unknown"


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"shape seed (default {DEFAULT_SEED}; printed and recorded)")
    ap.add_argument("--ops", type=parse_ops, default=list(OPS), help="comma-separated: " + ",".join(OPS))
    ap.add_argument("--n", type=int, default=None, help=f"cases per op (default {DEFAULT_N}, --quick {QUICK_N})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_N} cases per op, smaller compile budgets")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply the per-op configuration budgets")
    ap.add_argument("--jobs", type=int, default=None, help="compile processes before the run (0: compile lazily)")
    ap.add_argument("--out", default=str(ROOT / "profiles" / "results"), help="directory of the JSON result")
    ap.add_argument("--list", action="store_true", help="print the cases and their kernels, run nothing (CPU)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    n = args.n or (QUICK_N if args.quick else DEFAULT_N)
    budgets = QUICK_BUDGET if args.quick else BUDGET
    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.list:
        print("sweep: no CUDA device: skipped (--list plans the cases on the CPU)")
        return 0
    print(f"sweep: seed {args.seed}, {n} cases per op, ops {','.join(args.ops)}", flush=True)
    t0 = time.perf_counter()
    cases, keys = [], []
    for op in args.ops:
        cs, ks = select_cases(op, n, args.seed, max(1, round(budgets[op] * args.budget_scale)))
        for c in cs:  # keys as indices into the global list
            c["keys"] = [len(keys) + i for i in c["keys"]]
        cases += cs
        keys += ks
        print(f"  {op}: {len(cs)} cases, {len(ks)} kernel configurations", flush=True)
    print(f"planned in {time.perf_counter() - t0:.1f} s", flush=True)
    if args.list:
        for c in cases:
            print(f"{c['id']:<18} {case_name(c)}  [{c['plan']}]")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    from cute_kernels.common import jit

    jobs = default_jobs() if args.jobs is None else args.jobs
    compile_s, compile_errors = 0.0, []
    if jobs > 0:
        print(f"compiling {len(keys)} configurations in {jobs} processes ...", flush=True)
        compile_s, compile_errors = precompile(keys, jobs)
        print(f"compiled / loaded in {compile_s:.1f} s, {len(compile_errors)} errors", flush=True)
        for e in compile_errors:
            print("  compile error:", e, flush=True)
    compiles_before = jit.stats["compiles"]
    results = []
    t_run = time.perf_counter()
    for c in cases:
        r = run_case(c)
        results.append(r)
        print(case_line(c, r), flush=True)
    run_s = time.perf_counter() - t_run
    summary = summarize(cases, results)
    print(f"--- sweep seed {args.seed}: {len(cases)} cases in {run_s:.1f} s "
          f"(+ {compile_s:.1f} s compiling; {jit.stats['compiles'] - compiles_before} compiles during the run)")
    for line in summary_lines(summary):
        print(line)
    failures = sum(s["failures"] for s in summary.values())
    commit = commit_name()
    now = datetime.datetime.now(datetime.timezone.utc)
    doc = dict(schema="cute-kernels-sweep/1", seed=args.seed, quick=args.quick, n_per_op=n, ops=args.ops,
               commit=commit, date=now.date().isoformat(), time_utc=now.strftime("%H:%M:%S"),
               device=torch.cuda.get_device_name(), torch=torch.__version__,
               tolerances=dict(TOL=TOL, LSE_TOL=LSE_TOL, ROW_FLOOR=ROW_FLOOR),
               compile=dict(configurations=len(keys), seconds=round(compile_s, 1), errors=compile_errors,
                            compiles_during_run=jit.stats["compiles"] - compiles_before),
               run_seconds=round(run_s, 1), summary=summary,
               cases=[dict(id=c["id"], op=c["op"], name=case_name(c), plan=c.get("plan"),
                           params={k: v for k, v in c.items() if k not in ("id", "plan", "keys")},
                           **{k: r.get(k) for k in ("ok", "err", "tail", "lse", "nonfinite", "msg", "splits")},
                           ms=round(r["ms"], 1))
                      for c, r in zip(cases, results)])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"sweep-{now.date().isoformat()}-{commit}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(_json_safe(doc), indent=1) + "\n")
    print(f"wrote {path}  ({failures} failures)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

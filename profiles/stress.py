"""Small ragged cases of every kernel and mode, for compute-sanitizer memcheck / racecheck / synccheck.

    python3 profiles/stress.py --precompile        # compile every case's kernel in parallel, then run (no sanitizer)
    compute-sanitizer --tool memcheck python3 profiles/stress.py
    compute-sanitizer --tool racecheck python3 profiles/stress.py --ops gemm,merge
    python3 profiles/stress.py --list              # the cases and the kernels they run (CPU)

Each case runs once and is checked against a float32 / float64 reference computed on the CPU (so under
a sanitizer only our kernels and a few fills and copies run on the GPU), with NaN-poisoned outputs,
the elementwise + per-row check of ``sweep.compare`` and the -inf / LSE check; one line per case, a
summary per op, exit status 1 on any wrong result (0 without a CUDA device: skipped).  ``--ops``
(gemm, decode, merge, flash) and ``-k SUBSTRING`` (of the case names) select cases, so the tool runs can
be split across device calls.

Covered: GEMM persistent TMA (full tiles, ragged M/N/K, TMA-store and direct-store epilogues, column-major
and padded outputs, batched, alpha / beta with C in bf16 / fp32 / column-major, fp16, fp32 and mixed
outputs), the deferred epilogue on one cluster + a PDL chain, the cp.async mainloop (misaligned base,
odd K / M leading dimensions, batched), the cluster split-K (DSMEM), the persistent split-K (last-CTA
fixup, with C), the swapped skinny plans (16-, 32- and 64-wide tiles; DSMEM slices, fixup slices, A
multicast pairs with and without slices) and the split-K kernels with A multicast forced on partial
clusters; decode contiguous (TMA and cp.async loads) and paged (pages of 16 / 48 / 64 / 256), split
counts 1 / several / more than tiles / auto, GQA and MQA, Sq 1..16 causal and not, zero and one-token
lengths; merge_states (1 / 3 / 33 parts, empty parts, strided parts, fp32 / bf16 / fp16); the attention
forward at head dims 64 / 96 / 128 / 256, causal and not, GQA, lengths 1 / 17 / 129 / 1000 in Q and K
(rows that see no key), fp16, a (B, H, S, D) view; packed batches (empty and length-1 sequences, rows
past the last sequence), sliding windows, dense and packed, and paged K/V (pages of 16 / 48 / 64).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sweep as SW  # noqa: E402  (the shared case runners and checks)

G, DEC, MRG, FWD = SW.gemm_case, SW.decode_case, SW.merge_case, SW.flash_case
PERSISTENT = {"splitk_mode": "persistent"}
CPASYNC = {"stage": False}  # misaligned operands read in place (PlanChoice.stage)


def cases() -> list[dict]:
    """Every stress case (seeds fixed: the same tensors every run)."""
    cs = [
        # ---- GEMM: the persistent TMA kernel
        G(256, 256, 256),                                                   # full tiles, TMA store
        G(200, 136, 72, a_major="col"),                                     # ragged M/N/K, TMA OOB fill
        G(296, 264, 136, b_major="col", out_layout="col"),                  # column-major out (TMA store)
        G(130, 257, 200, pad=True, out_layout="odd"),                       # padded operands, direct-store epilogue
        G(130, 264, 200, batch=3, alpha=1.5, beta=0.5, c_dtype="bfloat16"),  # batched, alpha / beta with C
        G(333, 520, 136, alpha=0.5, beta=-1.25, c_dtype="float32", c_major="col", out_dtype="float32"),
        G(129, 392, 64, dtype="float16", pad=True, out_layout="pad"),       # fp16, padded views (TMA store)
        G(129, 385, 64, dtype="float16", pad=True, out_layout="pad"),       # N not 16-byte: direct store
        G(1000, 520, 96, out_dtype="float16"),                              # bf16 in, fp16 out; 2x1 cluster
        G(1280, 2560, 128),                                                 # 128 x 256 tiles
        G(520, 700, 200, pad=True, out_layout="pad",                        # 256 x 128 tiles on an N pair
          choice={"tile_m": 256, "tile_n": 128, "cluster": [1, 2], "splitk_mode": "none"}),
        G(520, 776, 264, choice={"epi_defer": True, "max_active_clusters": 1}, alpha=1.5, chain=True),
        G(300, 520, 104, choice={"epi_defer": True, "max_active_clusters": 1}, chain=True),
        # ---- GEMM: the cp.async mainloop (operands TMA cannot describe), forced (these sizes stage by default)
        G(100, 136, 131, choice=CPASYNC),                                   # K = 131: rows of A 2-byte aligned
        G(67, 200, 64, a_major="col", ptr_off=1, choice=CPASYNC),           # misaligned base pointer
        G(150, 99, 77, batch=2, b_major="col", out_dtype="float32", choice=CPASYNC),  # batched, odd leading dims
        G(140, 127, 100, out_layout="pad"),                                 # N = 127: staged (the default)
        # ---- GEMM: split-K
        G(128, 256, 1024, choice={"splitk_mode": "cluster", "splits": 2}),  # cluster split-K (DSMEM)
        G(200, 300, 2048, pad=True, choice={**PERSISTENT, "splits": 3}),    # persistent split-K, last-CTA fixup
        G(260, 136, 1536, choice={**PERSISTENT, "splits": 4}, alpha=0.5, beta=1.0, c_dtype="bfloat16"),
        # ---- GEMM: the swapped skinny plans (M <= 64)
        G(1, 300, 1000, pad=True),                                          # 16-wide tile, 2 slices in a cluster
        G(7, 129, 64, b_major="col"),                                       # one slice, element stores
        G(20, 256, 4096),                                                   # 32-wide tile, 8 slices, fixup
        G(48, 384, 1024),                                                   # A multicast pairs, one slice
        G(48, 384, 8192),                                                   # A multicast pairs, 2 slices (fixup)
        G(40, 200, 640, beta=0.5, c_dtype="bfloat16"),                      # 64-wide tile (C: no pairs)
        G(64, 136, 2048, out_dtype="float32"),                              # 64-wide tile, fp32 out, slices
        # ---- GEMM: the split-K kernels with A multicast forced (padding CTAs of a partial cluster)
        G(130, 296, 1000, mcast=["cluster", 32, 1, 2]),                     # 10 N tiles of 32 in 5 pairs
        G(130, 200, 1000, mcast=["fixup", 32, 2, 2]),                       # 7 N tiles: the last pair pads
        # ---- decode: contiguous caches (TMA + evict-first; cp.async forced)
        DEC(2, 1, 8, 2, 128, [1000, 333], splits=4),
        DEC(3, 4, 8, 2, 64, [17, 1, 129], splits=3),                        # Sq 4 causal, a length 1 < Sq
        DEC(2, 16, 8, 2, 128, [1000, 0], splits=1),                         # 64 rows per CTA, direct, length 0
        DEC(2, 5, 16, 2, 256, [129, 17], splits=2, causal=False),           # D 256, 40 rows, non-causal
        DEC(1, 2, 32, 2, 128, [100], cap=130, splits=16),                   # more splits than KV tiles
        DEC(3, 2, 4, 2, 128, [1000, 65, 64], splits=5, load="cpasync"),     # contiguous cp.async loads
        DEC(2, 1, 8, 8, 64, [1000, 513], dtype="float16"),                  # MHA, fp16, auto splits
        # ---- decode: paged caches (cp.async gather through the block table)
        DEC(3, 1, 16, 4, 128, [1000, 17, 1], cap=1024, page=16),            # auto splits (small pages)
        DEC(3, 3, 4, 2, 64, [129, 640, 63], cap=640, page=64, splits=4),    # Sq 3 causal
        DEC(2, 1, 8, 1, 256, [1000, 257], cap=1024, page=256, splits=2),    # MQA, D 256
        DEC(2, 2, 8, 2, 128, [200, 48], cap=240, page=48, splits=1, causal=False),  # page of 48, direct
        # ---- merge_states
        MRG(1, [37], 128),
        MRG(3, [2, 19], 64, dtype="bfloat16", p_empty=0.3),                 # empty parts (o NaN, ignored)
        MRG(33, [65], 256, p_empty=0.5, strided=True),                      # strided parts, all-empty rows
        MRG(5, [4, 9], 128, dtype="float16", p_empty=1.0),                  # every part empty: 0 and -inf
        # ---- the attention forward: each head dim, causal and not, ragged lengths
        FWD(2, 17, 1000, 4, 1, 64),
        FWD(1, 1000, 129, 4, 2, 64, causal=True),                           # Sq > Sk: rows that see no key
        FWD(1, 129, 17, 2, 2, 96),
        FWD(2, 1, 1000, 4, 2, 96, causal=True),
        FWD(2, 129, 1000, 4, 2, 128),
        FWD(1, 1000, 1000, 2, 1, 128, causal=True),
        FWD(1, 17, 129, 4, 4, 256, causal=True),
        FWD(2, 1000, 17, 2, 1, 256),
        FWD(1, 200, 77, 4, 1, 128, dtype="float16", layout="bhsd"),         # fp16, (B, H, S, D) views
        FWD(1, 300, 130, 8, 2, 64, causal=True, dtype="float16"),
        # packed sequences (empty, length-1, off-tile; rows past the last sequence) and windows
        FWD(4, 300, 300, 4, 2, 128, causal=True, lens=[[0, 5], [1, 1], [299, 300], [130, 17]], pad=3),
        FWD(3, 200, 260, 4, 1, 64, lens=[[200, 0], [17, 260], [129, 129]], pad=1),
        FWD(3, 129, 129, 2, 2, 96, causal=True, lens=[[129, 129], [1, 129], [64, 1]], window=(40, 0)),
        FWD(2, 150, 300, 2, 1, 256, lens=[[150, 300], [3, 7]], window=(100, 20)),
        FWD(2, 700, 1000, 4, 2, 128, causal=True, window=(129, 0)),
        FWD(1, 300, 300, 4, 4, 64, window=(0, 0)),
        # paged K/V (shuffled pages, unused ones NaN) under packed queries: a box per page, several per tile
        FWD(4, 200, 300, 4, 2, 128, causal=True, lens=[[0, 5], [1, 1], [200, 300], [130, 17]], pad=2, page=16),
        FWD(3, 150, 260, 4, 1, 64, lens=[[150, 0], [17, 260], [129, 129]], page=64),
        FWD(2, 129, 400, 2, 2, 256, causal=True, lens=[[129, 400], [5, 7]], window=(100, 0), page=48),
    ]
    for i, c in enumerate(cs):
        c["seed"] = 1000 + i
    return cs


def select(cs: list[dict], ops: list[str], pattern: str | None) -> list[dict]:
    out = [c for c in cs if c["op"] in ops and (not pattern or pattern in SW.case_name(c))]
    counts: dict = {}
    for c in out:
        n = counts[c["op"]] = counts.get(c["op"], 0) + 1
        c["id"] = f"{c['op']}#{n - 1}"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=SW.parse_ops, default=list(SW.OPS), help="comma-separated: gemm,decode,merge,flash")
    ap.add_argument("-k", dest="pattern", default=None, help="only cases whose name contains this substring")
    ap.add_argument("--precompile", action="store_true",
                    help="compile every case's kernels in parallel processes first (not under a sanitizer)")
    ap.add_argument("--jobs", type=int, default=None, help="processes for --precompile")
    ap.add_argument("--list", action="store_true", help="print the cases and their plans, run nothing (CPU)")
    ap.add_argument("--ref-device", default="cpu", choices=("cpu", "cuda"), help="where inputs and references are made")
    args = ap.parse_args(argv)

    import torch

    has_cuda = torch.cuda.is_available()
    if not has_cuda and not args.list:
        print("stress: no CUDA device: skipped (--list plans the cases on the CPU)")
        return 0
    cs = select(cases(), args.ops, args.pattern)
    t0 = time.perf_counter()
    keys: dict = {}
    for c in cs:
        ks, c["plan"] = SW.plan_case(c)
        for k in ks:
            keys.setdefault(k, len(keys))
    print(f"stress: {len(cs)} cases, {len(keys)} kernel configurations (planned in {time.perf_counter() - t0:.1f} s)",
          flush=True)
    if args.list:
        for c in cs:
            print(f"{c['id']:<18} {SW.case_name(c)}  [{c['plan']}]")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.precompile:
        jobs = args.jobs or SW.default_jobs()
        secs, errors = SW.precompile(list(keys), jobs)
        print(f"compiled / loaded {len(keys)} configurations in {secs:.1f} s on {jobs} processes, {len(errors)} errors",
              flush=True)
        for e in errors:
            print("  compile error:", e, flush=True)
    from cute_kernels.common import jit

    results = []
    t0 = time.perf_counter()
    for c in cs:
        r = SW.run_case(c, args.ref_device)
        results.append(r)
        print(SW.case_line(c, r), flush=True)
    summary = SW.summarize(cs, results)
    bad = sum(s["failures"] for s in summary.values())
    print(f"--- stress: {len(cs)} cases in {time.perf_counter() - t0:.1f} s, {bad} wrong, "
          f"{jit.stats['compiles']} compiled here, {jit.stats['disk_hits']} loaded from the disk cache "
          f"(sanitizer: {os.environ.get('CK_SANITIZER', 'none')})")
    for line in SW.summary_lines(summary):
        print(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

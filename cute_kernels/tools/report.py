"""Compile every kernel family for sm_90a and report its resources — the CPU half of the demo.

Why: on a machine without a GPU the most useful thing this package can do is prove each kernel builds
for Hopper and show what it compiles to (registers, spills, tensor-core and TMA instruction counts).
The same list is the CPU compile test (``tests/test_report.py``).
"""

from __future__ import annotations

import time
from typing import Callable

from . import inspect as ins


def representative_builders() -> list[tuple[str, Callable]]:
    """(label, builder) for one configuration of every kernel variant, import errors excluded."""
    out: list[tuple[str, Callable]] = []
    from layouts import tiles as T

    from ..gemm import heuristics as H
    from ..gemm.kernel import GemmConfig
    from ..gemm.launch import fake_args
    from ..gemm.splitk_kernel import SplitKClusterConfig, SplitKFixupConfig

    for label, am, bm, tile_n, cluster, cd, has_c in [
        ("gemm bf16 128x256 cluster 2x1, A row / B row", "k", "mn", 256, (2, 1), "bfloat16", False),
        ("gemm fp16 128x128, A col / B col, beta*C, fp32 out", "mn", "k", 128, (1, 1), "float32", True),
    ]:
        ab = "float16" if label.startswith("gemm fp16") else "bfloat16"
        tiles = H.default_tiles(4096, 4096, 4096, 1, ab, am, bm, cd, "n")
        tiles = T.GemmTiles(tile_mnk=(128, tile_n, 64), cluster_mn=cluster,
                            mma=T.MmaTile(ab_dtype=ab, atom_n=tile_n, a_major=am, b_major=bm),
                            ab_stages=tiles.ab_stages if tile_n == 256 else 6, c_dtype=cd)
        cfg = GemmConfig(tiles=tiles, a_rank=2, has_c=has_c)
        out.append((label, lambda cfg=cfg, ab=ab, cd=cd: fake_args(cfg, ab, cd, "float32")))

    for label, cfg in [
        ("gemm bf16 256x128 cluster 1x2, swizzle 8 (two 64-row M-blocks per warpgroup; default when A >= 64 MB)",
         GemmConfig(tiles=H.default_tiles(8192, 8192, 8192, 1, "bfloat16", "k", "mn", "bfloat16", "n"),
                    raster_swizzle=8, max_active_clusters=66)),
        ("gemm bf16 128x256 cluster 2x1, deferred epilogue (stores under the next tile's mainloop; default "
         "when a CTA gets more than one tile)",
         GemmConfig(tiles=H.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "bfloat16"), raster_swizzle=8,
                    raster_along_m=False, max_active_clusters=66, epi_defer=True)),
        ("gemm bf16 cp.async mainloop 128x256, 8-byte vectors (row-major A with K % 8 != 0)",
         GemmConfig(tiles=H.make_gemm_tiles(256, (1, 1), "bfloat16", "k", "mn", "bfloat16"), mainloop="cpasync",
                    vec_a=8, vec_b=16)),
        ("gemm split-K 128x256 S=4 in the persistent schedule, 2x1 multicast (default for long K slices)",
         GemmConfig(tiles=H.make_gemm_tiles(256, (2, 1), "bfloat16", "k", "mn", "bfloat16"), splits=4,
                    max_active_clusters=66)),
        ("gemm split-K 128x64 over a 2-CTA cluster (DSMEM reduction; default for short K slices)",
         SplitKClusterConfig(tiles=H.splitk_tiles(64, "bfloat16", "k", "mn", "bfloat16"), splits=2, vec_store=True)),
        ("gemm M <= 16 transposed (out^T = b^T a^T): 128x16 tiles, S=4 fixup (default for skinny M)",
         SplitKFixupConfig(tiles=H.splitk_tiles(16, "bfloat16", "mn", "k", "bfloat16"), splits=4, a_evict_first=True)),
        ("gemm 32 < M <= 64 transposed: 128x32 tile pairs sharing the weight by multicast, 1x2 cluster "
         "(default)", SplitKClusterConfig(tiles=H.splitk_tiles(32, "bfloat16", "mn", "k", "bfloat16", 2), splits=1,
                                          a_evict_first=True)),
    ]:
        out.append((label, lambda cfg=cfg: fake_args(cfg, "bfloat16", "bfloat16", "bfloat16")))
    try:
        import torch

        from ..attention import decode as DA
        from ..attention import merge as MG

        # contiguous caches up to TMA_EF_MAX_KV_BYTES load with TMA + evict-first, larger ones and
        # paged caches with cp.async
        mib = DA.TMA_EF_MAX_KV_BYTES >> 20
        for label, paged, kv_bytes in ((f"contiguous <= {mib} MiB (TMA + evict-first)", False, 1 << 20),
                                       (f"contiguous > {mib} MiB (cp.async)", False, 0),
                                       ("paged16 (cp.async)", True, 0)):
            cfg = DA.make_config(torch.bfloat16, 128, 4, paged, 16 if paged else 0, True, True, kv_bytes=kv_bytes)
            out.append((f"decode_attn bf16 d128 GQA4 {label} split", DA.decode_builder(cfg)))
        out.append(("merge_states fp32 -> bf16 d128", MG.merge_builder(MG.MergeConfig("float32", "bfloat16", 128))))
        from ..attention import forward_kernel as FK

        for label, D, causal in (("bf16 d128 causal", 128, True), ("bf16 d128", 128, False), ("bf16 d64", 64, False)):
            cfg = FK.fwd_config("bfloat16", D, causal)
            out.append((f"flash_attn forward {label} (TMA K/V rings, {cfg.tile.consumer_warpgroups} consumer "
                        "warpgroups, P from registers)", FK.forward_builder(cfg)))
    except ImportError as e:  # pragma: no cover - attention modules missing
        out.append((f"attention kernels unavailable: {e}", None))
    return out


def compile_report(print_fn=print) -> list[dict]:
    rows = []
    for label, builder in representative_builders():
        if builder is None:
            print_fn(f"- {label}")
            continue
        t0 = time.perf_counter()
        rep = ins.inspect_builder(builder)
        dt = time.perf_counter() - t0
        for k in rep.kernels:
            row = dict(label=label, kernel=k.name, registers=k.registers, stack=k.stack_frame,
                       spills=k.spills, seconds=dt, **{op: k.instructions[op] for op in ins.COUNTED if k.instructions[op]})
            rows.append(row)
            ops = ", ".join(f"{op} {k.instructions[op]}" for op in ("HGMMA", "HMMA", "UTMALDG", "UTMASTG", "LDGSTS", "STSM", "LDSM") if k.instructions[op])
            print_fn(f"- {label}: compiled in {dt:.1f} s; {k.registers} regs/thread, stack {k.stack_frame} B, "
                     f"local-memory ops {k.spills}; {ops or 'no tensor-core/TMA ops'}")
    return rows

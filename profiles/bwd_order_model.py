"""How much the attention backward's causal grid loses to its launch order, modelled on the CPU.

Why: a causal backward CTA (one KV tile of one head) walks every query tile that sees its keys, so KV tile
0 walks them all and the last one walks one or two.  With the grid's (KV tile, head, batch) order each head's
longest CTA starts with the head, and the last head's starts near the end of the launch: the other SMs run
out of work while it finishes.  ``FlashBwdConfig.lpt`` numbers the grid in sections of heads (as many as
have their Q, dO and fp32 dQ fit in L2 together, the forward's causal schedule), KV tile 0 of every head of
the section first; the last CTAs to start are then the shortest.

The model: 132 SMs, one CTA per SM (the backward's shared memory), a CTA takes ``c0 + steps`` time units
(``steps``: its query tiles; ``c0``: fixed cost, in query-tile steps), CTAs start in order on the first SM
that frees up.  It ignores L2 effects (the sections are sized to keep them as the grid order does) and the
per-step differences of masked tiles.  Printed: the ideal (work / SMs), each order's makespan and their ratio.

    python3 profiles/bwd_order_model.py
"""

from __future__ import annotations

import heapq
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SMS = 132
#: the backward bench's shapes (name, B, Hq, S, D, causal, tile_m); tile_n 128
SHAPES = [("b4_h32_s4096_d128_causal", 4, 32, 4096, 128, True, 64),
          ("b1_h32_s16384_d128_causal", 1, 32, 16384, 128, True, 64),
          ("b2_hq32_hkv8_s8192_d128_causal", 2, 32, 8192, 128, True, 64),
          ("b16_h16_s1024_d128_causal", 16, 16, 1024, 128, True, 64),
          ("b4_h32_s4096_d96_causal", 4, 32, 4096, 96, True, 64),
          ("b4_h32_s4096_d128_full", 4, 32, 4096, 128, False, 64),
          ("b8_h32_s2048_d64_full", 8, 32, 2048, 64, False, 128)]


def makespan(order, cost, sms: int = SMS) -> float:
    """List scheduling: each CTA in ``order`` starts on the SM that frees up first."""
    free = [0.0] * sms
    end = 0.0
    for cta in order:
        t = heapq.heappop(free) + cost[cta]
        heapq.heappush(free, t)
        end = max(end, t)
    return end


def orders(B: int, H: int, S: int, D: int, tile_m: int, tile_n: int = 128):
    """``(grid order, lpt order)`` of (n_block, head, batch) triples (Sq = Sk = S)."""
    from cute_kernels.attention.backward_config import lpt_tile_coords_py

    num_n = -(-S // tile_n)
    grid = [(n, h, b) for b in range(B) for h in range(H) for n in range(num_n)]
    lpt = [lpt_tile_coords_py(i, num_n, H, B, S, D) for i in range(num_n * H * B)]
    return grid, lpt


def main() -> int:
    for name, B, H, S, D, causal, tile_m in SHAPES:
        num_m = -(-S // tile_m)
        grid, lpt = orders(B, H, S, D, tile_m)
        for c0 in (1.0, 4.0):
            cost = {cta: c0 + (num_m - (cta[0] * 128) // tile_m if causal else num_m) for cta in grid}
            ideal = sum(cost.values()) / SMS
            a, b = makespan(grid, cost), makespan(lpt, cost)
            print(f"{name:32s} c0={c0:.0f}: ideal {ideal:8.1f}, grid order {a:8.1f} ({ideal / a:.3f}), "
                  f"lpt {b:8.1f} ({ideal / b:.3f}); lpt / grid {a / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

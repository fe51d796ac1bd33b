"""A timing model of the deterministic backward's dQ turns (CPU, no kernel): one head's KV-tile CTAs, all
resident, each walking its query tiles; per tile the consumers take ``step`` us to produce dQ, and the
dQ warp waits for the tile's turn, issues the reduce-add, hands the buffer back once read, waits for
the add to complete (``add`` us) and counts the turn up (``count`` us), each poll of a semaphore seeing
a change ``poll`` us late.  Prints the modelled ratio (the default mode's time / this one) per layout.

Why: the deterministic mode's speed is bounded by two cycles -- one dQ warp's serial cycle per tile
(poll + add + count: every tile, unless two warps take turns) and the chain of turns at one query tile
(each hop the same latency, with the next KV tile ``M / N`` steps behind when starts are spread, 1 step
when every KV tile starts one tile after the previous, or when M = N) -- and this shows which one a
change moves, before a GPU run measures it (``ab_backward.py --variants det,det2w,det2wg``).

    python3 profiles/det_model.py [--add 2.0] [--step 2.6]
"""

from __future__ import annotations

import argparse

#: (name, query tiles M, KV tiles N) of the backward bench's dense shapes at their tiles
LAYOUTS = (("b4 h32 s4096 d128 full (64 x 128 tiles)", 64, 32),
           ("b4 h16 s4096 d256 full (64 x 64)", 64, 64),
           ("b8 h32 s2048 d64 full (128 x 128)", 16, 16))
#: (dQ warps, starts spread floor(n M / N) rather than n, dQ accumulators)
VARIANTS = ((1, False, 1), (1, True, 1), (2, False, 1), (2, True, 1), (2, True, 2))


def simulate(M: int, N: int, step: float, add: float, count: float, poll: float, read: float, warps: int,
             spread: bool, groups: int) -> float:
    """The time the last of one head's N KV-tile CTAs finishes (us)."""
    start = [n * M // N if spread else n % M for n in range(N)]
    walk = [[(start[n] + i) % M for i in range(M)] for n in range(N)]
    rank = {}  # (n, m) -> the turn: arrival order at m among the KV tiles of n's group
    for m in range(M):
        order = [n for _, n in sorted((walk[n].index(m), n) for n in range(N))]
        for g in range(groups):
            for k, n in enumerate(x for x in order if x % groups == g):
                rank[n, m] = k
    passed = {(g, m, 0): 0.0 for g in range(groups) for m in range(M)}  # turn k of (group, m) open at
    pos, ready, free_at = [0] * N, [step] * N, [0.0] * N
    warp_free = [[0.0] * warps for _ in range(N)]
    done = [0.0] * N
    moved = True
    while moved:
        moved = False
        for n in range(N):
            while pos[n] < M:
                i, m, g = pos[n], walk[n][pos[n]], n % groups
                opened = passed.get((g, m, rank[n, m]))
                if opened is None:
                    break
                write = max(ready[n], free_at[n])  # the consumers write tile i's dQ once the buffer is back
                w = i % warps
                issue = max(warp_free[n][w], write) + poll
                issue = max(issue, opened + poll)
                free_at[n] = issue + read
                counted = issue + add + count
                warp_free[n][w] = counted
                passed[g, m, rank[n, m] + 1] = counted
                ready[n] = write + step
                pos[n] += 1
                done[n] = max(counted, ready[n])
                moved = True
    if any(p < M for p in pos):
        raise RuntimeError("the modelled turns never finish")
    return max(done)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=float, default=2.6, help="us per query tile (D 128 full: 5124 us / 31 waves / 64)")
    p.add_argument("--add", type=float, default=2.0, help="us from issuing a tile's reduce-add to its completion")
    p.add_argument("--count", type=float, default=0.7, help="us of the fence and the atomic that pass the turn")
    p.add_argument("--poll", type=float, default=0.5, help="us until a semaphore's change is seen")
    p.add_argument("--read", type=float, default=0.3, help="us until the reduce has read the buffer")
    a = p.parse_args(argv)
    for name, M, N in LAYOUTS:
        for warps, spread, groups in VARIANTS:
            t = simulate(M, N, a.step, a.add, a.count, a.poll, a.read, warps, spread, groups)
            print(f"{name:40s} dQ warps {warps}, starts {'spread' if spread else 'n    '}, accumulators {groups}: "
                  f"{M * a.step / t:.3f} of the default")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

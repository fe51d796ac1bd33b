"""Variants of the attention backward's main kernel timed against the planned one, paired, in one process.

Why: a tile or schedule candidate (a ``FlashBwdConfig`` the planner does not choose yet) is judged on the
backward bench's shapes by the same timer at the same moment: each repetition calls every variant once, in
rotated order, each after its own L2 flush (``timing.paired_times``); the figure is the median of the
per-repetition ratios.  Before timing, every variant's dq accumulator, dk and dv are compared with the
planned configuration's on the same inputs (max |diff| / max |ref|).

    python3 profiles/ab_backward.py --variants tm128 --out $OUT [--shapes b8_h32_s2048_d64_full,...]

Variants (name -> the change to the planned configuration; a variant that does not apply to a head dim
is skipped there):
    tm128   128 query rows per step, dQ split by rows (``dq_split_m``): FlashAttention-3/4's D = 64 tile
    tm64    64 query rows per step, dQ split by columns (the tile before 2026-12-03 at D = 64)
    carry   ``BwdTile.dk_carry``: dK += dS^T Q from shared memory, running on into the next query tile (its
            stage handed back there), so the tensor pipe does not drain per tile (D <= 128)
    dvearly ``BwdTile.dv_early``: dV += P^T dO issued before the dP^T wait, so the tensor pipe runs it while
            dS^T is computed (D 96 / 128: D 64's 128-row tile spills 42-50 local-memory instructions with it)
    carryearly  both
    tm64early  D 64's 64-row tile with ``dv_early`` (the 128-row tile spills 48 local-memory instructions with
            it and ptxas serializes every wgmma; the 64-row one compiles clean, all 32 exp2 ahead of the dP^T wait)
    qdo     ``BwdTile.qdo_rings``: Q + LSE and dO + Delta in rings of their own, S^T waiting for Q alone and
            dP^T for dO, dO handed back after dV and Q after dK (FlashAttention-4's SM90 order)
    qdoearly  ``qdo_rings`` and ``dv_early``
    bound   the planned configuration's MMA bound (``mma_only``: mask, exponentials and dS compiled out, the
            bench's ceiling), timed beside the variants so each reads against it; its gradients are wrong
            by design (not compared)
    kvreduce  ``FlashBwdConfig.kv_reduce`` (GQA shapes): dK / dV staged in the K / V buffers and added by TMA
            reduce-adds (FlashAttention-3/4's form) instead of D atomic adds per thread and their addresses
    lpt     ``FlashBwdConfig.lpt``: causal grids taken longest KV tile first in L2-sized sections of heads (the
            forward's causal order) instead of head by head; `profiles/bwd_order_model.py` predicts 1.03x
            on b4 s4096 / b2 s8192 causal, 1.05x on b16 s1024 (the tail of the last head's longest tile)

Whole-call variants (``flash_attn_backward`` with an argument, against the default call: pre-pass, main
kernel, post-pass and the call's own buffers timed; not mixed with the kernel variants in one run):
    det     ``deterministic=True`` (issue 33's target: within 15% of the default); checked first to give
            the same bits on two calls, and gradients within bf16 noise of the default's
    det2w   the same with ``BwdTile.dq_warps = 2`` (two dQ warps taking the query tiles by parity: an add's
            completion wait leaves the per-tile cycle), the call's plan swapped in around each call
    det2wg  and ``BwdTile.dq_groups = 2`` (two dQ accumulators, KV tiles n mod 2 in turn among their own:
            a turn has twice the steps to pass on; for M = N, D 64 and D 256, where starts cannot spread)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _tm128(cfg):
    if cfg.head_dim != 64 or cfg.tile.tile_m == 128:
        return None
    return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, tile_m=128, dq_split_m=True))


def _tm64(cfg):
    if cfg.tile.tile_m == 64:
        return None
    return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, tile_m=64, dq_split_m=False))


def _set_tile(field: str, applies=lambda cfg: not cfg.tile.kv_split_d):
    """The variant setting ``BwdTile.<field>`` where ``applies(cfg)`` and it is not set yet."""
    def change(cfg):
        if not applies(cfg) or getattr(cfg.tile, field):
            return None
        return dataclasses.replace(cfg, tile=dataclasses.replace(cfg.tile, **{field: True}))
    return change


def _both(first, then):
    """``first``'s change, then ``then``'s (None where either does not apply)."""
    def change(cfg):
        c = first(cfg)
        return None if c is None else then(c)
    return change


def _lpt(cfg):
    if not cfg.causal or cfg.deterministic or cfg.varlen or cfg.lpt:
        return None
    return dataclasses.replace(cfg, lpt=True)


def _kv_reduce(cfg):
    if not cfg.kv_reduce_applies or cfg.kv_reduce:
        return None
    return dataclasses.replace(cfg, kv_reduce=True)


def _bound(cfg):
    return None if cfg.softcap or cfg.mma_only else dataclasses.replace(cfg, mma_only=True)


_carry, _qdo = _set_tile("dk_carry"), _set_tile("qdo_rings")
_dv_early = _set_tile("dv_early", lambda cfg: not cfg.tile.kv_split_d and cfg.tile.tile_m != 128)
VARIANTS = {"tm128": _tm128, "tm64": _tm64, "carry": _carry, "dvearly": _dv_early,
            "carryearly": _both(_carry, _dv_early), "tm64early": _both(_tm64, _dv_early), "qdo": _qdo,
            "qdoearly": _both(_qdo, _dv_early), "lpt": _lpt, "kvreduce": _kv_reduce, "bound": _bound}
#: variants whose gradients are wrong by design (timed, not compared)
UNCHECKED = {"bound"}
CALL_VARIANTS = {"det": dict(deterministic=True), "det2w": dict(deterministic=True),
                 "det2wg": dict(deterministic=True)}
#: whole-call variants whose main kernel's tile differs from the plan's: the change to the tile (None: n/a)
CALL_TILES = {"det2w": lambda t: dataclasses.replace(t, dq_warps=2),
              "det2wg": lambda t: dataclasses.replace(t, dq_warps=2, dq_groups=2)}


def _tile_swapped(call, shape, kw, tile_fn):
    """``call(**kw)`` with the main kernel's tile changed by ``tile_fn`` for the duration of each call (the
    memoized plan of the call's key swapped in and back); None where ``tile_fn`` gives None."""
    import torch

    from cute_kernels.attention import backward as BW

    _, _, Hq, Hkv, _, D, causal = shape
    plan = BW.bwd_plan(torch.bfloat16, D, causal, gqa=Hq != Hkv, deterministic=kw.get("deterministic", False))
    key = next(k for k, v in BW._PLANS.items() if v is plan)
    tile = tile_fn(plan[0].tile)
    if tile is None:
        return None
    swapped = BW.plan_around(dataclasses.replace(plan[0], tile=tile))  # (dq_groups: dQ's post-pass too)

    def run():
        BW._PLANS[key] = swapped
        try:
            return call(**kw)
        finally:
            BW._PLANS[key] = plan
    return run


def _inputs(shape):
    """q, k, v, dout of a bench shape: fresh bf16 normals (seed 0), (B, S, H, D)."""
    import torch

    _, B, Hq, Hkv, S, D, _ = shape
    torch.manual_seed(0)
    mk = lambda h: torch.randn(B, S, h, D, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    return mk(Hq), mk(Hkv), mk(Hkv), mk(Hq)


def _time_into(row, calls, reps):
    """Paired times of ``calls`` (name -> zero-argument callable, "planned" first) into ``row``: each
    side's median and each variant's median per-repetition ratio to "planned"."""
    from cute_kernels.tools.bench.timing import paired_ratio, paired_times

    times = paired_times(calls, reps)
    row["median_us"] = {n: statistics.median(t) for n, t in times.items()}
    for n in calls:
        if n != "planned":
            row["ratio_vs_planned"][n] = round(paired_ratio(times, "planned", n), 4)
    return row


def run_shape_calls(shape, variants, reps):
    """The whole-call variants of one shape: checks, then paired times against the default call."""
    import torch

    import cute_kernels

    name, causal = shape[0], shape[6]
    q, k, v, dout = _inputs(shape)
    with torch.no_grad():
        out, lse = cute_kernels.flash_attn(q, k, v, causal=causal, return_lse=True)
    call = lambda **kw: cute_kernels.flash_attn_backward(dout, q, k, v, out, lse, causal=causal, **kw)  # noqa: E731
    ref = [g.float() for g in call()]
    row = {"shape": name, "checks": {}, "ratio_vs_planned": {}}
    calls = {"planned": call}
    for vname in variants:
        kw = CALL_VARIANTS[vname]
        run = (lambda kw=kw: call(**kw)) if vname not in CALL_TILES else _tile_swapped(call, shape, kw,
                                                                                        CALL_TILES[vname])
        if run is None:
            row["checks"][vname] = "n/a"
            continue
        a, b = run(), run()
        torch.cuda.synchronize()
        row["checks"][vname] = {
            "repeatable": all(torch.equal(x, y) for x, y in zip(a, b)),
            "vs_default": [round(float((x.float() - r).abs().max() / r.abs().max()), 5) for x, r in zip(a, ref)]}
        calls[vname] = run
    return _time_into(row, calls, reps)


def run_shape(shape, variants, reps):
    import torch

    import cute_kernels
    from cute_kernels.tools.bench import attention_backward as AB

    name, _, Hq, Hkv, _, D, causal = shape
    q, k, v, dout = _inputs(shape)
    with torch.no_grad():
        out = cute_kernels.flash_attn(q, k, v, causal=causal)
    calls = {"planned": AB.main_kernel_call(q, k, v, out, dout, causal)}
    row = {"shape": name, "checks": {}, "ratio_vs_planned": {}}
    from cute_kernels.attention import backward as BW

    planned = BW.bwd_plan(q.dtype, D, causal, gqa=Hq != Hkv)[0]
    for vname in variants:
        fn = VARIANTS[vname]
        if fn(planned) is None:
            row["checks"][vname] = "n/a"
            continue
        try:
            calls[vname] = AB.main_kernel_call(q, k, v, out, dout, causal, fn)
        except Exception as e:  # noqa: BLE001 - a candidate that fails to build or launch: a note
            row["checks"][vname] = f"{type(e).__name__}: {str(e)[:160]}"
    # correctness: one fresh call of each, compared with the planned configuration's buffers
    outs = {}
    for n, (run, bufs) in calls.items():
        bufs[0].zero_()
        if Hq == Hkv:
            bufs[1].fill_(float("nan")), bufs[2].fill_(float("nan"))
        else:
            bufs[1].zero_(), bufs[2].zero_()
        run()
        torch.cuda.synchronize()
        outs[n] = [b.float().clone() for b in bufs]
    ref = outs["planned"]
    for n, o in outs.items():
        if n in UNCHECKED:
            row["checks"][n] = "not compared (wrong gradients by design)"
        elif n != "planned":
            row["checks"][n] = [round(float((a - r).abs().max() / r.abs().max().clamp_min(1e-30)), 5)
                                for a, r in zip(o, ref)]
    return _time_into(row, {n: c[0] for n, c in calls.items()}, reps)


def plans_of(shapes, variants, whole: bool) -> list[tuple]:
    """Every backward configuration the run will compile (the bench shapes' default plans, and each
    variant's main kernel or, for whole-call variants, its plan), for :func:`cute_kernels.attention.backward.precompile`."""
    import torch

    from cute_kernels.attention import backward as BW

    plans = []
    for _, _, Hq, Hkv, _, D, causal in shapes:
        plan = BW.bwd_plan(torch.bfloat16, D, causal, gqa=Hq != Hkv)
        plans.append(plan)
        for vname in variants:
            if not whole:
                cfg = VARIANTS[vname](plan[0])
                plans += [(cfg,)] if cfg is not None else []
                continue
            det = BW.bwd_plan(torch.bfloat16, D, causal, gqa=Hq != Hkv, **CALL_VARIANTS[vname])
            tile = CALL_TILES[vname](det[0].tile) if vname in CALL_TILES else det[0].tile
            if tile is not None:
                plans.append(BW.plan_around(dataclasses.replace(det[0], tile=tile)))
    return plans


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="tm128")
    p.add_argument("--shapes", default="")
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default="")
    p.add_argument("--jobs", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)),
                   help="processes compiling every configuration first (1: compile as each is met)")
    a = p.parse_args(argv)
    from cute_kernels.tools.bench.attention_shapes import select

    variants = [v for v in a.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS) - set(CALL_VARIANTS)
    if unknown:
        p.error(f"unknown variants {sorted(unknown)}; known: {sorted(VARIANTS) + sorted(CALL_VARIANTS)}")
    whole = [v for v in variants if v in CALL_VARIANTS]
    if whole and len(whole) != len(variants):
        p.error("whole-call variants (det, det2w, det2wg) and kernel variants (tm128, tm64) go in separate runs")
    shapes = [s for s in select(a.shapes) if whole or s[5] in (64, 96, 128)]  # (kernel variants' tiles)
    if a.jobs > 1:  # ~3 s of CPU per config, dozens per run: in parallel first, the timed loop loads them
        import torch

        from cute_kernels.attention import backward as BW
        from cute_kernels.attention import forward as FW

        forward = {FW.plan(torch.bfloat16, s[5], s[6], False, False, 0, False, False) for s in shapes}  # (the outs)
        errors = FW.precompile(sorted(forward, key=repr), a.jobs) + BW.precompile(plans_of(shapes, variants, bool(whole)),
                                                                                  a.jobs)
        for e in errors:
            print(f"precompile: {e}", flush=True)
    rows = []
    for shape in shapes:
        row = (run_shape_calls if whole else run_shape)(shape, variants, a.reps)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if a.out:
        with open(os.path.join(a.out, "ab-backward.json"), "w") as f:
            json.dump({"commit": os.environ.get("CK_COMMIT", "?"), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

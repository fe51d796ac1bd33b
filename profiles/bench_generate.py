"""Eager ``generate()`` tokens/s and where a decode step's host time goes: the kernels against HF's sdpa.

Why (issue 34's eager target): HF's default decoding runs eagerly, so a step is mostly host time; the
target is ``cute_kernels`` eager >= 1.0x HF sdpa eager both on ``bench model``'s StaticCache step and on
``generate()`` tokens/s for a fixed prompt.  This runs the second, and ``--profile`` shows the first's
host time per function.

Model: ``bench model``'s Llama-3-8B-shaped model (``--layers`` layers, random weights, bf16).  Sides:
``cute_kernels`` (``attn_implementation="cute_kernels"`` + ``patch_linear``), ``sdpa`` (Transformers'
own, cuBLAS) and ``sdpa_gqa`` (torch's function with ``enable_gqa``, causal on the prefill, no mask:
what a user gets writing the attention by hand).  Each: ``generate(prompt (B, P), max_new_tokens=T,
min_new_tokens=T, do_sample=False)`` on its default ``DynamicCache``, the wall clock around it
(synchronized), and the same with ``max_new_tokens=1`` (the prefill and first token), so the decode
rate is ``B * (T - 1) / (t_T - t_1)``.  Rounds interleaved, the order rotated per round; medians and
scatter ((max - min) / median) over rounds.  ``cute_kernels``' ``hf_stats`` must show no fallback.

``--profile``: one ``bench model`` StaticCache decode step per side (batch 1, ``--ctx``) under cProfile
(``--profile-steps`` steps): the functions with the most own time per step, and the step's wall time.

    python3 profiles/bench_generate.py [--batches 1,8] [--prompt 512] [--new 64] [--rounds 5] [--layers 4]
        [--profile] [--ctx 4096] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

GEN_GQA = "cute_kernels_bench_gen_gqa"


def _gen_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Torch's attention with ``enable_gqa``, no mask: causal on a prefill (Sq == Sk, unpadded), every
    key for one new token (a DynamicCache holds only valid keys)."""
    import torch

    if attention_mask is not None or dropout or (query.shape[2] > 1 and query.shape[2] != key.shape[2]):
        raise ValueError("the sdpa_gqa generate side runs unpadded prefills and one-token steps")
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=True,
                                                           is_causal=query.shape[2] > 1)
    return out.transpose(1, 2).contiguous(), None


def activate(model, side: str) -> None:
    from cute_kernels.integrations import hf
    from cute_kernels.tools import bench_model as BM

    if side == "sdpa_gqa":
        model.set_attn_implementation(GEN_GQA)
        hf.unpatch_linear(model)
    else:
        BM.activate(model, side, None)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def generate_s(model, ids, new: int) -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds) of one greedy ``generate`` of exactly ``new`` tokens,
    synchronized.  The CPU time is the host's work (plus any spinning in the final synchronize), which
    an eager batch-1 decode is bound by."""
    import torch

    _sync()
    t0, c0 = time.perf_counter(), time.thread_time()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                         do_sample=False, pad_token_id=0, disable_compile=True)
    _sync()
    assert out.shape[1] == ids.shape[1] + new, out.shape
    return time.perf_counter() - t0, time.thread_time() - c0


def run_generate(model, batch: int, prompt: int, new: int, rounds: int, sides) -> dict:
    import torch

    from cute_kernels.integrations import hf

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, model.config.vocab_size, (batch, prompt), generator=g).to(model.device)
    toks, notes = {}, []
    for side in sides:  # warm: compiles, caches; the tokens each side generates
        activate(model, side)
        hf.reset_stats()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, pad_token_id=0, disable_compile=True)
        toks[side] = out[:, prompt:].cpu()
        if side == "cute_kernels":
            stats = dict(hf.hf_stats)
            if stats["fallback"]:
                notes.append(f"cute_kernels fell back: {stats}")
    t = {(s, n): [] for s in sides for n in (1, new)}
    cpu = {key: [] for key in t}
    keys = list(t)
    for r in range(rounds):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            activate(model, key[0])
            wall, c = generate_s(model, ids, key[1])
            t[key].append(wall)
            cpu[key].append(c)
    res = {"batch": batch, "prompt": prompt, "new": new, "rounds": rounds, "notes": notes, "sides": {}}
    for s in sides:
        full, first = statistics.median(t[(s, new)]), statistics.median(t[(s, 1)])
        dec = [batch * (new - 1) / (a - b) for a, b in zip(t[(s, new)], t[(s, 1)])]
        res["sides"][s] = {"generate_s": full, "first_token_s": first, "tokens_per_s": batch * new / full,
                           "decode_tokens_per_s": statistics.median(dec),
                           # host CPU time per decode step (all batch rows): the (new) run's less the 1-token run's
                           "host_us_per_step": statistics.median(
                               (a - b) / (new - 1) * 1e6 for a, b in zip(cpu[(s, new)], cpu[(s, 1)])),
                           "scatter": (max(t[(s, new)]) - min(t[(s, new)])) / full,
                           "rounds_s": t[(s, new)], "first_rounds_s": t[(s, 1)],
                           "same_tokens_as_sdpa": bool(torch.equal(toks[s], toks["sdpa"])) if "sdpa" in toks else None,
                           "tokens_agree_frac_vs_sdpa": float((toks[s] == toks["sdpa"]).float().mean())
                           if "sdpa" in toks else None}
    return res


def profile_steps(model, ctx: int, steps: int, sides, top: int = 22) -> dict:
    """cProfile of ``steps`` StaticCache decode steps (batch 1) per side: own time per step by function."""
    from cute_kernels.tools import bench_model as BM

    cache, lengths = BM.make_cache(model, 1, ctx)
    step = BM.DecodeStep(model, cache, lengths, 1, ctx)
    out = {}
    for side in sides:
        BM.activate(model, side, ctx + 1)
        for _ in range(3):
            step()
        _sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync()
        wall = (time.perf_counter() - t0) / steps * 1e6
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(steps):
            step()
        _sync()
        pr.disable()
        st = pstats.Stats(pr)
        rows = sorted(((v[2] / steps * 1e6, v[3] / steps * 1e6, v[1] / steps, f"{os.path.basename(k[0])}:{k[1]}:{k[2]}")
                       for k, v in st.stats.items()), reverse=True)
        prof_total = sum(r[0] for r in rows)
        out[side] = {"wall_us_per_step": wall, "profiled_us_per_step": prof_total,
                     "top_own_us": [[round(a, 1), round(b, 1), round(c, 1), n] for a, b, c, n in rows[:top]]}
        print(f"--- {side}: {wall:.0f} us/step wall, {prof_total:.0f} us/step under cProfile "
              "(own us, cumulative us, calls per step, function)")
        for a, b, c, n in rows[:top]:
            print(f"  {a:8.1f} {b:8.1f} {c:6.1f}  {n}")
    del cache, step
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--profile-only", action="store_true")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--profile-steps", type=int, default=20)
    p.add_argument("--tiny", action="store_true", help="a small config (a smoke test, CPU too)")
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    import torch
    import transformers
    from transformers.masking_utils import AttentionMaskInterface

    from cute_kernels.tools import bench_model as BM
    from cute_kernels.tools import bench_model_families as families

    BM.register_sides()
    transformers.AttentionInterface.register(GEN_GQA, _gen_gqa)
    AttentionMaskInterface.register(GEN_GQA, lambda *args, **kwargs: None)
    over = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=1000) if a.tiny else {}
    model = BM.build_model(families.family_config("llama", a.layers, **over),
                           "cuda" if torch.cuda.is_available() else "cpu")
    sides = ("cute_kernels", "sdpa", "sdpa_gqa")
    doc = {"commit": os.environ.get("CK_COMMIT", "?"),
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "transformers": transformers.__version__, "layers": a.layers,
           "generate": [], "profile": None}
    if a.profile or a.profile_only:
        doc["profile"] = profile_steps(model, a.ctx, a.profile_steps, ("cute_kernels", "sdpa", "sdpa_gqa"))
    if not a.profile_only:
        for b in (int(x) for x in a.batches.split(",") if x):
            r = run_generate(model, b, a.prompt, a.new, a.rounds, sides)
            doc["generate"].append(r)
            base = r["sides"]["sdpa"]
            for s, v in r["sides"].items():
                print(f"b{b} P{a.prompt} T{a.new} {s:13s} {v['tokens_per_s']:8.1f} tok/s "
                      f"(decode {v['decode_tokens_per_s']:8.1f}, x{v['tokens_per_s'] / base['tokens_per_s']:.3f} "
                      f"of sdpa, decode x{v['decode_tokens_per_s'] / base['decode_tokens_per_s']:.3f}) scatter "
                      f"{100 * v['scatter']:.1f}% first {1e3 * v['first_token_s']:.1f} ms "
                      f"host {v['host_us_per_step']:.0f} us/step "
                      f"same tokens {v['same_tokens_as_sdpa']} ({v['tokens_agree_frac_vs_sdpa']:.3f})", flush=True)
            for n in r["notes"]:
                print("  note:", n)
    if a.out:
        with open(os.path.join(a.out, "bench-generate.json"), "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

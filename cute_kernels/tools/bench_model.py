"""End-to-end decode benchmark: a Llama-3-8B-shaped Transformers model on the kernels against the same
model on PyTorch (``cute-kernels bench model``, ``python3 profiles/bench_model.py``).

Model: ``LlamaForCausalLM`` of :data:`LLAMA3_8B`'s shapes with ``--layers`` layers (default 4), random
weights, bf16 (``--family mistral``: ``MistralForCausalLM``, the same shapes, sliding window 4096,
:mod:`.bench_model_families`).  Its ``StaticCache`` (capacity ctx + :data:`EXTRA_SLOTS`) holds random
K/V and length ctx: a step is ``model(input_ids (B, 1), position_ids=ctx, past_key_values=cache, logits_to_keep=1)``
(no sampling), which first sets the lengths back to ctx (:class:`DecodeStep`), so every repetition,
eager or a graph replay, writes the same slot and reads the same ctx + 1 keys.

Sides (same model, cache and inputs):
- ``cute_kernels`` (ours): ``attn_implementation="cute_kernels"`` (:mod:`..integrations.hf`,
  ``decode_attn`` on the cache in place) + :func:`~..integrations.hf.patch_linear` (linears on ``gemm``).
- ``sdpa``: Transformers' ``attn_implementation="sdpa"`` + cuBLAS, as a user gets it: with a
  ``StaticCache`` it builds a (B, 1, 1, capacity) mask and, having a mask, copies the KV heads out
  (``repeat_kv``) before torch's function.
- ``sdpa_gqa``: torch's ``scaled_dot_product_attention`` on the valid keys (a slice, no copy),
  ``enable_gqa=True``, no mask, torch's backend choice + cuBLAS (registered as :data:`GQA_NAME`).

Each side runs eager and as a captured CUDA graph of one step (a failed capture is a row note); "the
best PyTorch configuration" is the fastest of the four PyTorch rows.  Timing: ``rounds`` interleaved
rounds (order rotated per round), each the median of ``iters`` steps timed alone by CUDA events and
synchronized; eager steps include the host's work (as in a decode loop), graph replays start after a
GPU spin so the launch is not timed.  Reported: median over rounds, scatter = (max - min) / median.

Split (eager, ``torch.profiler``): kernel time per step by name (:func:`bucket`): attention, GEMMs and
the rest (norms, RoPE, cache writes, masks, ``repeat_kv``); ``gap`` = eager step - kernel time.
Read bound: bytes a step must read (weights but the embedding table, B embedding rows, K/V of ctx + 1
positions in every layer) / the read bandwidth measured in the run, the faster of a bare read
(``torch.sum`` of 2 GiB) and a 2 GiB ``copy_`` counted as read + written bytes.

Target (issue 20): ours >= 1.0x the best PyTorch configuration at every point (within the same-run
scatter) and >= 1.03x geomean, or "at bound" where both sides are within 3% of the read bound.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from .args import OneLineParser, int_in, one_line
from . import bench_model_families as families
from .bench import results, timing
from .bench_model_families import LLAMA3_8B, llama_config  # noqa: F401 - the llama family, as before

PROG = "cute-kernels bench model"
OURS, HF_SDPA, SDPA_GQA = "cute_kernels", "sdpa", "sdpa_gqa"
SIDES = (OURS, HF_SDPA, SDPA_GQA)
MODES = ("eager", "graph")
#: the Transformers attention name of the ``sdpa_gqa`` side
GQA_NAME = "cute_kernels_bench_sdpa_gqa"
#: cache slots past ctx (the step writes slot ctx)
EXTRA_SLOTS = 8
BUCKETS = ("attention", "gemm", "rest")
_ATTN_RE = re.compile(r"flash|fmha|cudnn|sdpa|attn|attention|mha|decode|mergestates|merge_state", re.IGNORECASE)
_GEMM_RE = re.compile(r"gemm|gemv|nvjet|cublas|xmma|splitk", re.IGNORECASE)
#: the read-bound criterion: both sides within this fraction of the bound
AT_BOUND = 0.03
DEFAULTS = {"batches": (1, 8, 32), "contexts": (4096, 32768), "rounds": 3, "iters": 20, "profile_steps": 3}
QUICK = {"batches": (1, 8), "contexts": (4096,), "rounds": 2, "iters": 8, "profile_steps": 2}


# ------------------------------------------------------------------------------------------ model
def build_model(config, device, dtype=torch.bfloat16, seed: int = 0):
    """Random-weight ``LlamaForCausalLM`` built on ``device`` (no download, no CPU copy of the weights)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


def _sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """The ``sdpa_gqa`` side's attention (HF's signature): one new token against the first ``_GQA_LEN``
    keys (set by :func:`activate`), torch's function with ``enable_gqa``, no mask."""
    n = _GQA_LEN[0]
    if query.shape[2] != 1 or n is None or attention_mask is not None or dropout:
        raise ValueError("the sdpa_gqa side runs decode steps of one token, valid length set by activate()")
    out = torch.nn.functional.scaled_dot_product_attention(query, key[:, :, :n], value[:, :, :n], scale=scaling,
                                                           enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


_GQA_LEN: list = [None]  # the valid key count of the ``sdpa_gqa`` side's step


def register_sides() -> None:
    """``cute_kernels`` (hf.register) and :data:`GQA_NAME` with Transformers (idempotent)."""
    import transformers
    from transformers.masking_utils import AttentionMaskInterface

    from ..integrations import hf

    hf.register()
    transformers.AttentionInterface.register(GQA_NAME, _sdpa_gqa)
    AttentionMaskInterface.register(GQA_NAME, lambda *args, **kwargs: None)  # no mask: one query sees every key


def activate(model, side: str, valid_len: int | None = None) -> None:
    """Put ``model`` on ``side``'s attention and linears (idempotent)."""
    from ..integrations import hf

    model.set_attn_implementation({OURS: hf.NAME, HF_SDPA: "sdpa", SDPA_GQA: GQA_NAME}[side])
    _GQA_LEN[0] = valid_len
    if side == OURS:
        hf.patch_linear(model, require_cuda=False)
    else:
        hf.unpatch_linear(model)


def make_cache(model, batch: int, ctx: int, seed: int = 0):
    """(cache, lengths): a ``StaticCache`` of capacity ctx + EXTRA_SLOTS holding random K/V (slots >=
    ctx zero) with every layer's length a view into ``lengths`` (one (layers,) int64 buffer, = ctx)."""
    from transformers import StaticCache

    cfg = model.config
    p = next(model.parameters())
    cache = StaticCache(config=cfg, max_cache_len=ctx + EXTRA_SLOTS)
    cache.early_initialization(batch, cfg.num_key_value_heads, cfg.head_dim, p.dtype, p.device)
    gen = torch.Generator(device=p.device).manual_seed(seed)
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            t[:, :, :ctx].normal_(generator=gen)
            t[:, :, ctx:].zero_()
    lengths = torch.full((len(cache.layers),), ctx, dtype=torch.int64, device=p.device)
    for i, layer in enumerate(cache.layers):  # StaticLayer.update adds to it in place: one fill resets all
        layer.cumulative_length = lengths[i]
    families.sliding_layers(cache, ctx)  # sliding layers: as after a prefill of ctx tokens (families' doc)
    return cache, lengths


class DecodeStep:
    """One decode step at position ``ctx`` (callable; returns the (B, 1, vocab) logits)."""

    def __init__(self, model, cache, lengths, batch: int, ctx: int, seed: int = 0):
        self.model, self.cache, self.lengths, self.ctx = model, cache, lengths, ctx
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g).to(lengths.device)
        self.pos = torch.full((batch, 1), ctx, dtype=torch.int64, device=lengths.device)
        self.sliding = families.sliding_layers(cache, ctx)

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        self.lengths.fill_(self.ctx)
        for layer in self.sliding:
            layer.cumulative_length_int = self.ctx
        return self.model(input_ids=self.ids, position_ids=self.pos, past_key_values=self.cache, use_cache=True,
                          logits_to_keep=1).logits


# ------------------------------------------------------------------------------------ bytes / split
def weight_bytes(model, batch: int) -> int:
    """Weights a step reads: every parameter but the input embedding table, plus its ``batch`` rows."""
    emb = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not emb)
    return total + batch * emb.shape[1] * emb.element_size()


def kv_bytes(config, batch: int, ctx: int, elem: int = 2) -> int:
    """K + V bytes of ``ctx + 1`` positions (the cache and the new token) over every layer."""
    return batch * families.kv_positions(config, ctx) * config.num_key_value_heads * config.head_dim * 2 * elem


def bucket(name: str) -> str:
    """A CUDA kernel's bucket by name: attention, gemm or rest (unknown names)."""
    return "attention" if _ATTN_RE.search(name) else "gemm" if _GEMM_RE.search(name) else "rest"


def split(kernels, steps: int) -> dict:
    """{bucket: microseconds per step} of ``[(kernel name, microseconds), ...]`` over ``steps`` steps,
    plus ``kernels`` (their sum) and the top kernels of each bucket by time."""
    per_name: dict = {}
    for name, us in kernels:
        per_name[name] = per_name.get(name, 0.0) + us / steps
    out = {b: sum(t for n, t in per_name.items() if bucket(n) == b) for b in BUCKETS}
    out["kernels"] = sum(out[b] for b in BUCKETS)
    out["top"] = {b: [[n[:120], round(t, 1)] for n, t in sorted(per_name.items(), key=lambda kv: -kv[1])
                      if bucket(n) == b][:4] for b in BUCKETS}
    return out


def profile_split(step, steps: int) -> dict:
    """:func:`split` of ``steps`` eager steps under ``torch.profiler`` (CUDA kernels only), after one
    unprofiled step."""
    step()
    return split(timing.profiled_kernels(step, steps), steps)


# ---------------------------------------------------------------------------------------- timing
def time_steps(fn, iters: int, cuda: bool = True, lead: bool = False) -> float:
    """Median microseconds of ``iters`` calls, each timed alone by CUDA events (``cuda=False``: wall
    clock); ``lead``: the GPU spins :data:`.timing.LEAD_CYCLES` first, so a graph replay's launch is
    not timed (:func:`.timing.event_us`)."""
    ts = []
    for _ in range(iters):
        if cuda:
            ts.append(timing.event_us(fn, lead=lead))
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def capture(step):
    """A CUDA graph of one step (warmed on a side stream first), or the one-line reason it failed."""
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        g.replay()
        torch.cuda.synchronize()
        return g, None
    except Exception as e:  # noqa: BLE001 - reported as the row's note
        with contextlib.suppress(Exception):  # the reason above is what matters
            torch.cuda.synchronize()
        return None, f"capture failed: {type(e).__name__}: {one_line(e)[:200]}"


def measure_bandwidth(nbytes: int = 2 << 30, iters: int = 10) -> dict:
    """The device's read bandwidth in bytes/us: the faster of a bare read (``torch.sum``) of
    ``nbytes`` and a ``copy_`` of ``nbytes`` counted as read + written bytes (module doc)."""
    bufs = [torch.ones(nbytes // 4, dtype=torch.float32, device="cuda"), torch.empty((), device="cuda")]
    read_us = time_steps(lambda: torch.sum(bufs[0], dim=0, out=bufs[1]), iters + 1)
    bufs[1] = torch.empty_like(bufs[0])
    copy_us = time_steps(lambda: bufs[1].copy_(bufs[0]), iters + 1)
    bufs.clear()
    torch.cuda.empty_cache()
    read, copy = nbytes / read_us, 2 * nbytes / copy_us
    return {"read_TBps": read / 1e6, "copy_TBps": copy / 1e6, "bound_TBps": max(read, copy) / 1e6,
            "how": f"max(torch.sum of {nbytes >> 20} MiB, copy_ of {nbytes >> 20} MiB as 2x bytes), "
                   f"median of {iters} CUDA-event timings"}


# ---------------------------------------------------------------------------------------- a point
def run_point(model, batch: int, ctx: int, *, sides=SIDES, modes=MODES, rounds: int = 3, iters: int = 20,
              profile_steps: int = 3, bw_bytes_per_us: float | None = None, log=print) -> dict:
    """Every (side, mode) of one (batch, ctx) point: times, split, logits agreement, read bound."""
    from ..integrations import hf

    cache, lengths = make_cache(model, batch, ctx)
    step, restore = DecodeStep(model, cache, lengths, batch, ctx), families.snapshot(cache)
    on_gpu = lengths.device.type == "cuda"
    modes = [m for m in modes if m == "eager" or on_gpu]
    res: dict = {"batch": batch, "ctx": ctx, "configs": {}, "split": {}, "notes": []}
    logits, fns = {}, {}
    for side in sides:  # warm: compiles our kernels on first use, the library's caches
        activate(model, side, ctx + 1)
        restore()  # a full sliding buffer rolls every step: each side's first steps on the same keys
        hf.reset_stats()
        t0 = time.time()
        try:
            out = [step() for _ in range(2)][-1]
        except Exception as e:  # noqa: BLE001 - the side is left out of this point, with the reason
            res["notes"].append(f"{side}: {type(e).__name__}: {one_line(e)[:300]}")
            log(f"  b{batch} ctx{ctx} {side}: {res['notes'][-1]}")
            continue
        logits[side] = out.float().cpu()
        log(f"  b{batch} ctx{ctx} {side}: first steps {time.time() - t0:.1f} s")
        if side == OURS:  # the kernels ran, not HF's sdpa fallback
            res["hf_stats"] = dict(hf.hf_stats)
            if hf.hf_stats["fallback"] or hf.hf_stats["decode_attn"] != 2 * model.config.num_hidden_layers:
                res["notes"].append(f"{OURS} attention did not run decode_attn on every layer: {hf.hf_stats}")
        fns[(side, "eager")] = (side, step)
        g, note = capture(step) if "graph" in modes else (None, None)
        if g is not None:
            fns[(side, "graph")] = (side, g.replay)
        elif note:
            res["notes"].append(f"{side} graph: {note}")
            log(f"  b{batch} ctx{ctx} {side} graph: {note}")
    ref = logits.get(HF_SDPA, next(iter(logits.values()), torch.ones(1)))
    scale = ref.abs().max().item() or 1.0
    res["logits_vs_sdpa"] = {s: (lg - ref).abs().max().item() / scale for s, lg in logits.items()}
    times: dict = {k: [] for k in fns}
    keys = list(fns)
    for r in range(rounds):  # interleaved, the order rotated per round
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            side, fn = fns[key]
            if key[1] == "eager":
                activate(model, side, ctx + 1)
            times[key].append(time_steps(fn, iters, on_gpu, lead=key[1] == "graph"))
    for (side, mode), ts in times.items():
        med = statistics.median(ts)
        res["configs"][f"{side}/{mode}"] = {"side": side, "mode": mode, "us": med, "rounds_us": ts,
                                            "scatter": (max(ts) - min(ts)) / med, "tokens_per_s": batch * 1e6 / med}
    if on_gpu and profile_steps:
        for side in [s for s in sides if (s, "eager") in fns]:
            activate(model, side, ctx + 1)
            try:
                sp = profile_split(step, profile_steps)
            except Exception as e:  # noqa: BLE001 - the timings stand without the split
                res["notes"].append(f"{side} split: {type(e).__name__}: {one_line(e)[:200]}")
                continue
            eager = res["configs"].get(f"{side}/eager")
            sp["gap"] = eager["us"] - sp["kernels"] if eager else None
            res["split"][side] = sp
    activate(model, HF_SDPA)
    nbytes = res["read_bytes"] = weight_bytes(model, batch) + kv_bytes(model.config, batch, ctx,
                                                                       cache.layers[0].keys.element_size())
    res["bound_us"] = nbytes / bw_bytes_per_us if bw_bytes_per_us else None
    res.update(verdict(res["configs"], res["bound_us"]))
    del fns, step, cache
    torch.cuda.empty_cache()  # no-op without CUDA
    return res


def verdict(configs: dict, bound_us: float | None) -> dict:
    """Best ours vs best PyTorch, per mode and overall; the target rule of the module doc."""
    ours = [v for v in configs.values() if v["side"] == OURS]
    peers = [v for v in configs.values() if v["side"] != OURS]
    out: dict = {"per_mode": {}}
    if not ours or not peers:
        return {**out, "ratio": None, "status": "incomplete"}
    for mode in MODES:
        o, p = [v for v in ours if v["mode"] == mode], [v for v in peers if v["mode"] == mode]
        if o and p:
            bp = min(p, key=lambda v: v["us"])
            out["per_mode"][mode] = {"ours_us": o[0]["us"], "torch_us": bp["us"], "torch": f"{bp['side']}/{mode}",
                                     "ratio": bp["us"] / o[0]["us"]}
    bo, bp = min(ours, key=lambda v: v["us"]), min(peers, key=lambda v: v["us"])
    ratio = bp["us"] / bo["us"]
    scatter = max(bo["scatter"], bp["scatter"])
    out.update(ours=f"{OURS}/{bo['mode']}", ours_us=bo["us"], torch=f"{bp['side']}/{bp['mode']}",
               torch_us=bp["us"], ratio=ratio, scatter=scatter)
    at_bound = bound_us is not None and bound_us / bo["us"] >= 1 - AT_BOUND and bound_us / bp["us"] >= 1 - AT_BOUND
    out["status"] = ("pass" if ratio >= 1.0 else "pass (within scatter)" if ratio >= 1.0 - scatter
                     else "at bound" if at_bound else "below")
    if bound_us:
        out.update(ours_pct_of_bound=100 * bound_us / bo["us"], torch_pct_of_bound=100 * bound_us / bp["us"])
    return out


def summarize(points: list) -> dict:
    """Geomean of the best-vs-best ratios and whether the issue's target holds."""
    ratios = [p["ratio"] for p in points if p.get("ratio")]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    ok_points = all(p.get("status", "").startswith("pass") or p.get("status") == "at bound" for p in points)
    return {"geomean": gm, "every_point": ok_points, "target_met": bool(ok_points and gm is not None and gm >= 1.03)}


# ---------------------------------------------------------------------------------------- output
def commit_name() -> str:
    """``CK_COMMIT`` (the device copy's .git may be stale: the caller names it), else ``git rev-parse
    HEAD`` of the repository holding this package, else "unknown"."""
    out = os.environ.get("CK_COMMIT", "")
    with contextlib.suppress(Exception):  # no git: "unknown"
        out = out or subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True,
                                    timeout=10, cwd=Path(__file__).resolve().parents[2]).stdout.strip()
    return out or "unknown"


def run_meta(args, layers: int) -> dict:
    import transformers

    now, family = datetime.datetime.now(datetime.timezone.utc), getattr(args, "family", "llama")
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "date": now.date().isoformat(), "time_utc": now.strftime("%H:%M:%S"), "commit": commit_name(),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "transformers": transformers.__version__, "python": platform.python_version()},
            "family": family, "model": families.model_meta(family, layers),
            "rounds": args.rounds, "iters": args.iters, "timer": "CUDA events per step (graphs: after a GPU "
            "spin), median of iters, median over interleaved rounds"}


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def _split_text(sp: dict | None) -> str:
    if not sp:
        return "-"
    return (f"attn {sp['attention']:.0f} / gemm {sp['gemm']:.0f} / rest {sp['rest']:.0f}"
            + ("" if sp.get("gap") is None else f" / gap {sp['gap']:.0f}"))


def table_rows(points: list) -> list[list[str]]:
    """The main table: one row per (point, mode) plus the best-vs-best row with the verdict."""
    rows = []
    for p in points:
        bound = p.get("bound_us")
        modes = [(mode, m, _split_text(p["split"].get(OURS)) if mode == "eager" else "")
                 for mode, m in p.get("per_mode", {}).items()]
        modes.append(("best", p, p.get("status", "-")))
        for mode, m, last in modes:
            us = m.get("ours_us")
            tok, peer = p["batch"] * 1e6 / us if us else None, f"{_fmt(m.get('torch_us'))} ({m.get('torch')})"
            rows.append([str(p["batch"]), str(p["ctx"]), mode, _fmt(us), peer, _fmt(m.get("ratio"), ".3f"),
                         _fmt(tok, ".0f"), _fmt(bound),
                         _fmt(100 * bound / us if bound and us else None, ".0f"), last])
    return rows


HEADER = ["batch", "ctx", "mode", "ours us/step", "best torch us/step", "ratio", "ours tok/s", "read bound us",
          "% of bound", "ours split (us/step) / status"]


def markdown(doc: dict) -> str:
    m = doc["meta"]
    title = families.TITLES[m.get("family", "llama")]
    lines = [f"# End-to-end decode: {title}, {m['model']['num_hidden_layers']} layers, bf16",
             "", f"{m['device']}, {m['date']} {m['time_utc']} UTC, commit {m['commit']}, "
             + ", ".join(f"{k} {v}" for k, v in m["versions"].items()), "",
             (f"Read bandwidth {doc['bandwidth']['bound_TBps']:.2f} TB/s ({doc['bandwidth']['how']}); "
              f"timer: {m['timer']} ({m['rounds']} rounds x {m['iters']} steps)."), "",
             "| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(doc["points"])]
    s = doc["summary"]
    lines += ["", (f"Geomean best-vs-best ratio: {_fmt(s['geomean'], '.3f')}; every point passes: "
                   f"{s['every_point']}; target (>= 1.0x every point within scatter or at bound, >= 1.03x geomean) "
                   f"met: {s['target_met']}."), "",
              "## Every configuration (us/step, scatter over rounds) and split (eager kernels, us/step)", "",
              "| batch | ctx | config | us/step | scatter | tok/s | split | logits vs sdpa (max rel) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in doc["points"]:
        for name, c in p["configs"].items():
            sp = _split_text(p["split"].get(c["side"])) if c["mode"] == "eager" else ""
            lines.append(f"| {p['batch']} | {p['ctx']} | {name} | {c['us']:.1f} | {100 * c['scatter']:.1f}% | "
                         f"{c['tokens_per_s']:.0f} | {sp} | {p['logits_vs_sdpa'].get(c['side'], 0):.2e} |")
        lines += [f"| {p['batch']} | {p['ctx']} | note | {note} | | | | |" for note in p["notes"]]
    return "\n".join(lines) + "\n"


def write_results(doc: dict, out_dir: str) -> str:
    """``doc`` as ``model-decode[-FAMILY]-DATE-COMMIT.json`` and ``.md`` in ``out_dir``; returns the path stem."""
    os.makedirs(out_dir, exist_ok=True)
    prefix = families.record_prefix(doc["meta"].get("family", "llama"))
    stem = os.path.join(out_dir, f"{prefix}-{doc['meta']['date']}-{doc['meta']['commit'][:7]}")
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(markdown(doc))
    return stem


# ------------------------------------------------------------------------------------------- CLI
def _int_list(s: str) -> tuple[int, ...]:
    """``"1,8,32"`` / ``"4k,32k"`` (k = 1024) -> distinct positive ints."""
    try:
        out = [int(x[:-1]) * 1024 if x.endswith("k") else int(x) for x in s.strip().lower().split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (4k = 4096), got {s!r}") from None
    if min(out) < 1:
        raise argparse.ArgumentTypeError(f"values must be >= 1, got {s!r}")
    return tuple(dict.fromkeys(out))


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Decode steps of a Llama-3-8B-shaped model (random weights, KV cache "
                      "pre-filled) on the kernels vs the same model on PyTorch sdpa + cuBLAS, eager and in graphs.")
    p.add_argument("--quick", action="store_true", help="batch 1 and 8, context 4k, fewer rounds and steps")
    p.add_argument("--family", choices=families.FAMILIES, default="llama", help="llama (default) or mistral "
                   f"(sliding window {families.MISTRAL_WINDOW}): the model's shapes and attention")
    p.add_argument("--layers", type=int_in(1, 32), default=4, help="decoder layers (default 4)")
    p.add_argument("--batches", type=_int_list, default=None, help="comma-separated batch sizes (default 1,8,32)")
    p.add_argument("--contexts", type=_int_list, default=None, help="comma-separated context lengths, 4k = 4096 "
                   "(default 4k,32k)")
    p.add_argument("--rounds", type=int_in(1), default=None, help="interleaved timing rounds (default 3, quick 2)")
    p.add_argument("--iters", type=int_in(1), default=None, help="timed steps per round (default 20, quick 8)")
    p.add_argument("--profile-steps", type=int_in(0), default=None, help="eager steps under the profiler for the "
                   "split, 0: no split (default 3, quick 2)")
    p.add_argument("--no-graphs", action="store_true", help="eager only")
    p.add_argument("--no-precompile", action="store_true", help="compile at first use, not in processes up front")
    p.add_argument("--out", default="profiles/results", help="JSON + markdown folder (default profiles/results)")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    a = parser().parse_args(argv)
    base = QUICK if a.quick else DEFAULTS
    for k, v in base.items():  # unset options take the preset's value
        setattr(a, k, v if getattr(a, k) is None else getattr(a, k))
    return a


def _warm_job(job) -> str:
    """Worker (spawned process): compile one kernel the model will run into the disk cache."""
    try:
        if job[0] == "gemm":
            from ..gemm.host import warmup_gemm

            warmup_gemm(*job[1:], b_major="col")
        else:
            from ..attention.decode import explain, get_decode_kernel

            get_decode_kernel(explain(*job[1:])["config"])
        return ""
    except Exception as e:  # noqa: BLE001 - reported; the run compiles it again where it is used
        return f"{job}: {type(e).__name__}: {one_line(e)[:200]}"


def precompile(config, batches, contexts, log=print) -> None:
    """Every GEMM and decode kernel of the grid (one job per distinct plan), compiled in parallel
    processes into the disk cache."""
    from ..attention.decode import explain as decode_explain
    from ..common import jit
    from ..gemm.host import explain as gemm_explain

    h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    shapes = [(h, h), (kv, h), (config.intermediate_size, h), (h, config.intermediate_size), (config.vocab_size, h)]
    jobs: dict = {}
    for b in batches:
        for n, k in shapes:
            jobs.setdefault(repr([r["config"] for r in gemm_explain(b, n, k, b_major="col")]), ("gemm", b, n, k))
        for c in contexts:
            job = ("decode", b, config.num_attention_heads, config.num_key_value_heads,
                   families.cache_len(config, c + EXTRA_SLOTS))
            jobs.setdefault(repr(decode_explain(*job[1:])["config"]), job)
    t0 = time.time()
    try:
        errors = jit.precompile_in_processes(_warm_job, list(jobs.values()))
    except Exception as e:  # noqa: BLE001 - the kernels then compile at first use
        errors = [f"parallel precompile failed: {type(e).__name__}: {one_line(e)[:200]}"]
    log(f"precompiled {len(jobs)} GEMM / decode plans in {time.time() - t0:.1f} s")
    for e in errors:
        log(f"  precompile error: {e}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{PROG}: error: needs a CUDA GPU (Hopper for the kernels); none is visible", file=sys.stderr)
        return 2
    if results.transformers_missing(PROG):
        return 2
    register_sides()
    config = families.family_config(args.family, args.layers)
    if not args.no_precompile:
        precompile(config, args.batches, args.contexts)
    model = build_model(config, "cuda")
    print(f"model: {args.family}, {args.layers} layers, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    bw = measure_bandwidth()
    print(f"read bandwidth {bw['bound_TBps']:.2f} TB/s (sum {bw['read_TBps']:.2f}, copy {bw['copy_TBps']:.2f})")
    points = []
    for batch in args.batches:
        for ctx in args.contexts:
            t1 = time.time()
            try:
                p = run_point(model, batch, ctx, modes=("eager",) if args.no_graphs else MODES, rounds=args.rounds,
                              iters=args.iters, profile_steps=args.profile_steps,
                              bw_bytes_per_us=bw["bound_TBps"] * 1e6)
            except Exception as e:  # noqa: BLE001 - the other points still run and are written
                p = {"batch": batch, "ctx": ctx, "configs": {}, "split": {}, "logits_vs_sdpa": {}, "bound_us": None,
                     "status": "error", "notes": [f"error: {type(e).__name__}: {one_line(e)[:300]}"]}
                torch.cuda.empty_cache()
            points.append(p)
            print(f"b{batch} ctx{ctx}: ours {p.get('ours_us', 0):.1f} us ({p.get('ours')}), torch "
                  f"{p.get('torch_us', 0):.1f} us ({p.get('torch')}), ratio {_fmt(p.get('ratio'), '.3f')}, "
                  f"bound {_fmt(p['bound_us'])} us, {p.get('status')} [{time.time() - t1:.0f} s]", flush=True)
    doc = {"meta": run_meta(args, args.layers), "bandwidth": bw, "points": points, "summary": summarize(points)}
    print(markdown(doc))
    stem = write_results(doc, args.out)
    print(f"wrote {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

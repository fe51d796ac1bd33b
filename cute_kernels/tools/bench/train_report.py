"""The training-step benchmark's figures (:mod:`.train`): the kernel categoriser, the step's attention /
GEMM / rest split, the ratios to the best PyTorch backend, the results document and its markdown.
Pure functions of recorded numbers and kernel names: no torch, no GPU.

Kernel categories (:func:`category`), by the name a profiler shows (CUPTI's kernel name):

- ours first, by the package path the CuTe DSL puts in every kernel it compiles:
  ``kernel_cutlass_kernel_cute_kernels<package><module><Class>_object_at_...`` (the ``@cute.kernel``
  method's name, then the kernel object's repr without dots, then the mangled arguments), so
  ``cute_kernelsattention...`` (``FlashAttnFwdSm90``, ``FlashAttnBwdSm90``, the backward's
  ``BwdPrepass`` / ``BwdConvert``, ``DecodeAttnKernel``, ``MergeStatesKernel``) is attention and
  ``cute_kernelsgemm...`` (``GemmSm90``, its split-K and cp.async variants) is GEMM;
- then PyTorch's and the libraries' attention kernels: FlashAttention (``pytorch_flash::flash_fwd_kernel``,
  ``flash_bwd_*``), memory-efficient (``fmha_cutlassF_*`` / ``fmha_cutlassB_*``,
  ``PyTorchMemEffAttention``), cuDNN (``cudnn_generated_fort_native_sdpa_sm90_flash_*``, any ``cudnn``);
- then GEMMs: ``gemm``, ``gemv``, ``cutlass``, ``nvjet``, ``xmma``, ``sm90``, ``cublas``, ``splitK``
  (the attention names are tested first because cuDNN's and the memory-efficient kernels' names
  carry ``sm90`` / ``cutlass`` too);
- everything else is "rest": norms, RoPE, activations, the loss, the optimizer's foreach kernels,
  embedding gradients, copies, memsets.  Helper kernels an attention call launches under generic names
  (a zero fill of an accumulator, torch's sum of FlashAttention's expanded dK / dV under GQA, HF's
  ``repeat_kv`` copies) land in "rest" too, on either side: the attention figure is the named
  attention kernels' time.
"""

from __future__ import annotations

import re
import statistics

from . import results

KIND = "train"
CATEGORIES = ("attention", "gemm", "rest")
#: the issue's target: our attention part at least this many times faster than the best PyTorch backend's
ATTENTION_TARGET = 1.1
#: a side whose first-step loss differs from the sides' median by more than this fraction is flagged
LOSS_RTOL = 1e-2
_OURS = re.compile(r"cute_kernels(attention|gemm)", re.IGNORECASE)
_ATTN = re.compile(r"flash|fmha|cudnn|sdpa|attention|attn|memeff|mem_eff", re.IGNORECASE)
_GEMM = re.compile(r"gemm|gemv|cutlass|nvjet|xmma|sm90|cublas|splitk", re.IGNORECASE)


def category(name: str) -> str:
    """The category of a CUDA kernel by its name: ``"attention"``, ``"gemm"`` or ``"rest"``."""
    m = _OURS.search(name)
    if m:
        return "attention" if m.group(1).lower() == "attention" else "gemm"
    if _ATTN.search(name):
        return "attention"
    return "gemm" if _GEMM.search(name) else "rest"


def split(kernels, steps: int = 1) -> dict:
    """``{attention, gemm, rest, kernels}`` in microseconds per step of ``[(kernel name, microseconds),
    ...]`` recorded over ``steps`` steps (``kernels`` = their sum), plus ``top``: the four longest
    kernels of each category, ``[name (120 characters), us per step]``."""
    ranked = results.per_kernel(kernels, steps)
    out: dict = {c: 0.0 for c in CATEGORIES}
    for name, us in ranked:
        out[category(name)] += us
    out["kernels"] = sum(out[c] for c in CATEGORIES)
    out["top"] = {c: [[n[:120], round(t, 1)] for n, t in ranked if category(n) == c][:4] for c in CATEGORIES}
    return out


def step_ratios(times: dict[str, list[float]], peers) -> dict[str, float]:
    """{side: the median over the repetitions of the fastest peer's step in that repetition / the side's}
    (above 1: the side is faster than every PyTorch backend); empty without a peer."""
    peers = [p for p in peers if times.get(p)]
    if not peers:
        return {}
    best = [min(times[p][r] for p in peers) for r in range(len(times[peers[0]]))]
    return {s: statistics.median(b / t for b, t in zip(best, ts)) for s, ts in times.items() if ts}


def attention_ratios(splits: dict[str, dict], peers) -> tuple[dict[str, float], str | None]:
    """({side: the best peer's attention time / the side's}, that peer) from the profiled splits: the
    best peer is the one whose attention kernels took the least time."""
    timed = {p: splits[p]["attention"] for p in peers if p in splits and splits[p].get("attention", 0) > 0}
    if not timed:
        return {}, None
    best = min(timed, key=timed.get)
    return ({s: timed[best] / sp["attention"] for s, sp in splits.items() if sp.get("attention", 0) > 0}, best)


def role_of(side: str, ours: str | None, our_sides) -> str:
    return "peer" if side not in our_sides else "ours" if side == ours else "variant"


def make_row(seq: int, batch: int, times: dict[str, list[float]], *, our_sides, splits=None, errors=None,
             losses=None, notes=None, memory=None) -> dict:
    """One results row for a sequence length: every side that ran (its per-repetition step times in
    microseconds, tokens/s, split, ratios) and every side that failed (its error).  ``ours`` is the
    faster of our sides by median step; the other is a ``variant``; the PyTorch backends are peers."""
    splits, errors, losses = splits or {}, errors or {}, losses or {}
    tokens = batch * seq
    ran = [s for s in our_sides if times.get(s)]
    ours = min(ran, key=lambda s: statistics.median(times[s])) if ran else None
    peers = [s for s in times if s not in our_sides and times[s]]
    steps = step_ratios(times, peers)
    attn, best_attn = attention_ratios(splits, peers)
    impls: dict = {}
    for side, ts in times.items():
        if not ts:
            continue
        med = statistics.median(ts)
        extra = {"tokens_per_s": tokens / (med * 1e-6), "scatter": (max(ts) - min(ts)) / med}
        if side in splits:
            sp = splits[side]
            extra["split"] = {**sp, "gap": med - sp["kernels"]}
        for key, val in (("step_ratio", steps.get(side)), ("attention_ratio", attn.get(side)),
                         ("loss", losses.get(side))):
            if val is not None:
                extra[key] = val
        impls[side] = results.impl_entry(role_of(side, ours, our_sides), ts, None, None, **extra)
    for side, err in errors.items():
        impls[side] = {"role": role_of(side, ours, our_sides), "error": err}
    best_step = min(peers, key=lambda p: statistics.median(times[p])) if peers else None
    ratio = attn.get(ours) if ours else None
    row = {"shape": f"b{batch}_s{seq}", "params": {"batch": batch, "seq": seq}, "tokens": tokens, "flops": None,
           "bytes": None, "bound": "compute", "impls": impls, "ours": ours, "ceiling": None,
           "best_peer_step": best_step, "best_peer_attention": best_attn, "attention_ratio": ratio,
           "attention_target": ATTENTION_TARGET,
           "attention_target_met": None if ratio is None else bool(ratio >= ATTENTION_TARGET),
           "notes": list(notes or [])}
    if memory:
        row["memory"] = memory
    return row


def loss_notes(losses: dict[str, float]) -> list[str]:
    """A note for each side whose first-step loss is off the sides' median by more than :data:`LOSS_RTOL`
    (every side starts from the same weights and inputs, so the losses agree to bf16 rounding)."""
    if len(losses) < 2:
        return []
    mid = statistics.median(losses.values())
    return [f"{s}: first-step loss {v:.5f} differs from the sides' median {mid:.5f} by more than "
            f"{100 * LOSS_RTOL:g}%" for s, v in losses.items() if not abs(v - mid) <= LOSS_RTOL * abs(mid)]


def document(meta: dict, rows: list[dict], notes=None) -> dict:
    """The run's results document (:data:`results.SCHEMA`, kind :data:`KIND`), with the attention
    target's verdict in its summary."""
    doc = results.document(KIND, meta, rows, notes=notes)
    ratios = {r["params"]["seq"]: r.get("attention_ratio") for r in doc["rows"]}
    judged = [x for x in ratios.values() if x is not None]
    doc["summary"].update(
        attention_target=ATTENTION_TARGET, attention_ratio_by_seq=ratios,
        geomean_attention_ratio=results.geomean(judged),
        attention_target_met=(bool(all(x >= ATTENTION_TARGET for x in judged))
                              if judged and len(judged) == len(ratios) else None))
    return doc


# ---- markdown ------------------------------------------------------------------------------------
def ratio_text(v) -> str:
    return "-" if v is None else f"{v:.3f}x"


def _ms(us) -> str:
    return "-" if us is None else f"{us / 1e3:.2f}"


HEADER = ("seq", "side", "step ms", "scatter", "tok/s", "x best torch step", "attention ms", "GEMM ms",
          "rest ms", "gap ms", "x best torch attention", "first loss")


def markdown(doc: dict) -> str:
    m, s = doc["meta"], doc["summary"]
    model = m.get("model", {})
    vers = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items())
    lines = [f"# Training step: Llama-3-8B shapes, {model.get('num_hidden_layers', '?')} layers, bf16, batch "
             f"{m.get('batch', '?')}; {m.get('device', '?')}, {m.get('date', '?')} {m.get('time_utc', '')} UTC, "
             f"commit {m.get('commit', '?')}", "",
             f"Step: {m.get('step', '?')}", "", f"Sides: {m.get('sides_how', '?')}", "",
             f"Timer: {m.get('timer', '?')}; {m.get('repeats', '?')} repetitions after {m.get('warmup', '?')} "
             f"warm-up steps per side.  Versions: {vers}.", "",
             f"Split: {m.get('split_how', '?')}", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in doc["rows"]:
        seq = r["params"]["seq"]
        for side, e in r["impls"].items():
            if "error" in e:
                lines.append(f"| {seq} | {side} | failed (below) |" + " |" * (len(HEADER) - 3))
                continue
            sp = e.get("split") or {}
            cells = [str(seq), side + (" (ours)" if side == r.get("ours") else ""), _ms(e["median_us"]),
                     f"{100 * e['scatter']:.1f}%", f"{e['tokens_per_s']:.0f}", ratio_text(e.get("step_ratio"))]
            cells += [_ms(sp.get(k)) for k in ("attention", "gemm", "rest", "gap")]
            cells += [ratio_text(e.get("attention_ratio")), "-" if e.get("loss") is None else f"{e['loss']:.4f}"]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Attention part (target: ours >= {ATTENTION_TARGET:.2f}x the best PyTorch backend's "
                  "attention kernels' time):"]
    for r in doc["rows"]:
        ratio = r.get("attention_ratio")
        lines.append(f"- seq {r['params']['seq']}: " + (
            "not judged (ours or every PyTorch backend missing a split)" if ratio is None else
            f"{ratio:.3f}x ({r['ours']} vs {r['best_peer_attention']}): "
            + ("met" if r["attention_target_met"] else "NOT met")))
    gm = s.get("geomean_vs_best_peer")
    lines += ["", "Whole step: " + ", ".join(
        f"seq {r['params']['seq']} {ratio_text(r.get('ratio_vs_best_peer'))} ({r.get('ours')} vs {r.get('best_peer_step')})"
        for r in doc["rows"]) + f"; geomean {ratio_text(gm)}.",
        "Attention target met at every length: " + {True: "yes", False: "no", None: "not judged"}[
            s.get("attention_target_met")] + ".  The longest kernels of each category are in the JSON "
        "(impls.SIDE.split.top)."]
    mem = [f"seq {r['params']['seq']}: " + ", ".join(f"{k} {v:.1f}" for k, v in r["memory"].items())
           for r in doc["rows"] if r.get("memory")]
    if mem:
        lines += ["", "Memory (GiB, torch.cuda allocator): " + "; ".join(mem) + "."]
    notes = list(doc.get("notes", [])) + [f"seq {r['params']['seq']}: {n}" for r in doc["rows"]
                                          for n in r.get("notes", [])]
    notes += [f"seq {r['params']['seq']}: {side} failed: {e['error']}" for r in doc["rows"]
              for side, e in r["impls"].items() if "error" in e]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"

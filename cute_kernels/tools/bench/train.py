"""Training-step benchmark (issue 33): a Llama-3-8B-shaped Transformers model's forward + loss +
backward + optimizer step on the kernels against the same step on each of PyTorch's SDPA backends, in
one process under one timer (``cute-kernels bench train``, ``python3 profiles/bench_train.py``).

Model: ``LlamaForCausalLM`` from a ``LlamaConfig`` of Llama-3-8B's shapes (hidden 4096, 32 query and
8 KV heads of 128, intermediate 14336, vocab 128256, RoPE theta 500000, untied embeddings:
:data:`..bench_model.LLAMA3_8B`) with ``--layers`` layers (default 4: 1.92 B parameters, 3.85 GB in
bf16), random weights from ``--seed``, bf16, train mode.  Input: ``--batch`` (default 1) sequences of
each ``--seqs`` length (default 4096 and 8192) of random token ids, one tensor for every side; the
labels are the ids (HF shifts them).

Step: ``loss = model(input_ids=ids, labels=ids, use_cache=False).loss`` (HF's cross entropy on fp32
logits), ``loss.backward()``, ``torch.optim.AdamW(foreach=True, lr=1e-5)`` step on the bf16 parameters
(its moments are bf16 too: no fp32 master weights), ``zero_grad(set_to_none=True)``.

Sides:

- ``cute_kernels``: ``attn_implementation="cute_kernels"`` (``flash_attn`` and its backward through
  autograd); the linears on cuBLAS;
- ``cute_kernels+gemm``: the same with :func:`~..integrations.hf.patch_linear` (every linear's forward
  and both backward GEMMs on ``gemm``);
- ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``: HF's ``"sdpa"`` with torch's backend forced by
  ``torch.nn.attention.sdpa_kernel`` (FLASH_ATTENTION, CUDNN_ATTENTION, EFFICIENT_ATTENTION) around
  the forward and the backward.  HF passes ``enable_gqa=True`` (no mask); a backend that refuses it
  runs on K/V heads expanded before the call (HF's ``repeat_kv``, what HF does where GQA is not
  available; noted).  A side that fails both ways (or runs out of memory) is reported failed with its
  error and the others go on.

Each side holds its own model (deep copies of one seeded model: the same initial weights) and its own
AdamW, so no side's update changes what another computes.  Memory (4 layers): weights + two moments
11.5 GB per side, 58 GB for five, plus the stepping side's gradients (3.85 GB) and one step's
activations (logits and their fp32 copy in the loss dominate: 2 + 4 GB per 8192 tokens and as much
again for their gradients); about 85 GB at batch 1 x 8192 on a 141 GB H200.  A larger ``--batch``
that does not fit fails the side that runs out, reported.

Timing (:func:`.timing.paired_times`): every side first runs ``--warmup`` steps alone (the first one
compiles our kernels, checks that ours ran on the kernels and records the loss), then each of
``--repeats`` repetitions runs every side's step once, in an order rotated by the repetition, each
step after an L2 flush and timed alone by CUDA events (host work included, as in a training loop).
Reported per side: the median step, its scatter ((max - min) / median), tokens/s, and the ratio to the
best PyTorch backend's step (the median over repetitions of that repetition's fastest backend / the
side).

Split: ``--profile-steps`` (default 1) more steps of each side under ``torch.profiler``; every CUDA
kernel's time summed by category of its name (:func:`.train_report.category`: attention, GEMM,
rest), ``gap`` = the median step minus the kernels' sum (host time the GPU waited for).  The
attention ratio is the best PyTorch backend's attention time (the least over the backends) / ours:
the issue's target is >= :data:`.train_report.ATTENTION_TARGET`; the whole step's ratio is reported
beside it.  Results: ``train[-TAG]-DATE-COMMIT.json`` and ``.md`` in ``--out``.

    cute-kernels bench train [--quick] [--layers N] [--seqs 4k,8k] [--batch B] [--repeats N] [--warmup N]
                             [--profile-steps N] [--sides LIST] [--seed S] [--no-precompile] [--tag T] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import os
import time
import warnings

from ..args import OneLineParser, int_in, one_line
from . import results
from . import train_report as R

KIND = R.KIND
PROG = "cute-kernels bench train"
OURS, OURS_GEMM = "cute_kernels", "cute_kernels+gemm"
OUR_SIDES = (OURS, OURS_GEMM)
#: the PyTorch sides and the ``torch.nn.attention.SDPBackend`` each forces
BACKENDS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION", "sdpa_efficient": "EFFICIENT_ATTENTION"}
SIDES = (*OUR_SIDES, *BACKENDS)
#: the Transformers attention name of a PyTorch side whose backend refuses ``enable_gqa``
REPEAT_KV_NAME = "cute_kernels_bench_sdpa_repeat_kv"
LR = 1e-5
DEFAULTS = {"layers": 4, "seqs": (4096, 8192), "repeats": 10, "warmup": 3, "profile_steps": 1}
QUICK = {"layers": 1, "seqs": (1024,), "repeats": 3, "warmup": 2, "profile_steps": 1}
STEP_WORDS = (f"loss = model(input_ids=ids, labels=ids, use_cache=False).loss (HF's cross entropy, fp32 logits); "
              f"loss.backward(); torch.optim.AdamW(foreach=True, lr={LR:g}).step() on the bf16 parameters "
              "(bf16 moments, no fp32 master weights); zero_grad(set_to_none=True)")
SIDES_WORDS = ("each side its own deep copy of one seeded model and its own AdamW, the same input ids; "
               f"{OURS}: attn_implementation='cute_kernels', linears on cuBLAS; {OURS_GEMM}: the same + "
               "hf.patch_linear (linears on cute_kernels.gemm); sdpa_*: HF 'sdpa' under "
               "torch.nn.attention.sdpa_kernel(the backend) around forward and backward")
TIMER = ("paired (timing.paired_times): every repetition runs every side's step once in an order rotated by the "
         "repetition, each step after an L2 flush (zero_ of 256 MiB) and timed alone by CUDA events, host work "
         "included; median over repetitions")
SPLIT_WORDS = ("torch.profiler over {n} extra step(s) per side: CUDA kernel time summed by name category "
               "(attention / GEMM / rest); gap = median step - the kernels' sum")


# ------------------------------------------------------------------------------------------- sides
def _sdpa_repeat_kv(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """HF's sdpa attention with the K/V heads expanded first (``repeat_kv``) and no ``enable_gqa``: the
    call HF makes where GQA is not available, for a backend that refuses ``enable_gqa``."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv

    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    is_causal = query.shape[2] > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=is_causal)
    return out.transpose(1, 2).contiguous(), None


def register_sides() -> None:
    """``cute_kernels`` (hf.register) and :data:`REPEAT_KV_NAME` with Transformers (idempotent)."""
    import transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from ...integrations import hf

    hf.register()
    transformers.AttentionInterface.register(REPEAT_KV_NAME, _sdpa_repeat_kv)
    AttentionMaskInterface.register(REPEAT_KV_NAME, sdpa_mask)


class Side:
    """One side: its model, its optimizer, the backend it forces (PyTorch sides), the step."""

    def __init__(self, name: str, model, lr: float = LR):
        import torch

        self.name, self.model, self.ids = name, model, None
        self.backend = BACKENDS.get(name)
        self.kv_expanded = False
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)

    def _context(self):
        if self.backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(getattr(SDPBackend, self.backend))

    def step(self):
        """One training step; returns the loss (a device tensor: no synchronization)."""
        with self._context():
            loss = self.model(input_ids=self.ids, labels=self.ids, use_cache=False).loss
            loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def expand_kv(self) -> None:
        """Run this PyTorch side on K/V heads expanded before the call (:func:`_sdpa_repeat_kv`)."""
        self.model.set_attn_implementation(REPEAT_KV_NAME)
        self.kv_expanded = True


def build_sides(config, names, device, seed: int = 0) -> dict[str, Side]:
    """{name: Side}: one seeded model, deep-copied for every side after the first (the same initial
    weights), put on its side's attention and linears."""
    from ...integrations import hf
    from ..bench_model import build_model

    base = build_model(config, device, seed=seed).train().requires_grad_(True)
    models = [base] + [copy.deepcopy(base) for _ in names[1:]]
    out = {}
    for name, model in zip(names, models):
        model.set_attn_implementation(hf.NAME if name in OUR_SIDES else "sdpa")
        if name == OURS_GEMM:
            hf.patch_linear(model, require_cuda=False)
        out[name] = Side(name, model)
    return out


# ------------------------------------------------------------------------------------------ checks
def _first_step(side: Side, layers: int, notes: list[str]) -> float:
    """The side's first step at this length: its loss; for ours, the kernel calls it made, a note when
    attention did not run ``flash_attn`` on every layer or the patched linears no ``gemm``.  A failure
    raises with the reason torch warned of (an SDPA backend's refusal) appended."""
    import cute_kernels.testing as T

    from ...integrations import hf

    hf.reset_stats()
    with warnings.catch_warnings(record=True) as caught, T.count_launches() as n:
        warnings.simplefilter("always")
        try:
            loss = float(side.step())
        except Exception as e:
            why = [one_line(str(w.message))[:200] for w in caught if "because" in str(w.message)]
            side.opt.zero_grad(set_to_none=True)
            raise RuntimeError(f"{type(e).__name__}: {one_line(e)[:240]}" + (f" ({'; '.join(why[:2])})" if why
                                                                            else "")) from e
    if side.name in OUR_SIDES:
        stats, calls = dict(hf.hf_stats), n.as_dict()
        if stats["fallback"] or stats["flash_attn"] != layers or calls.get("flash_attn_backward", 0) < layers:
            notes.append(f"{side.name}: attention did not run flash_attn forward and backward on every layer "
                         f"(hf_stats {stats}, launches {calls})")
        if side.name == OURS_GEMM and not calls.get("gemm"):
            notes.append(f"{side.name}: the patched linears made no gemm launch (launches {calls})")
    return loss


def warm(side: Side, steps: int, layers: int, notes: list[str], log=print) -> float:
    """``steps`` untimed steps (the first checked, :func:`_first_step`); returns the first loss.  A
    PyTorch side whose backend refuses the call retries on expanded K/V heads once; raises
    RuntimeError when the side cannot run."""
    try:
        loss = _first_step(side, layers, notes)
    except RuntimeError as e:
        if side.backend is None or side.kv_expanded:
            raise
        _free()
        log(f"  {side.name}: {e}; retrying with K/V heads expanded (repeat_kv)")
        side.expand_kv()
        try:
            loss = _first_step(side, layers, notes)
        except RuntimeError as e2:
            raise RuntimeError(f"with enable_gqa: {e}; with K/V expanded: {e2}") from e2
        notes.append(f"{side.name}: K/V heads expanded (repeat_kv) before SDPA, the backend refused enable_gqa: "
                     f"{str(e)[:200]}")
    for _ in range(steps - 1):
        side.step()
    return loss


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def profile_split(fn, steps: int) -> dict:
    """:func:`.train_report.split` of ``steps`` calls of ``fn`` under ``torch.profiler``."""
    from .timing import profiled_kernels

    return R.split(profiled_kernels(fn, steps), steps)


# ----------------------------------------------------------------------------------------- one length
def run_length(sides: dict[str, Side], seq: int, batch: int, *, repeats: int, warmup: int, profile_steps: int,
               seed: int = 0, time_one=None, log=print) -> dict:
    """Warm, check, time and profile every side at one sequence length; the results row."""
    import torch

    from . import timing

    first = next(iter(sides.values())).model
    cfg, device = first.config, next(first.parameters()).device
    on_gpu = device.type == "cuda"
    gen = torch.Generator().manual_seed(seed + seq)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(device)
    errors, losses, notes = {}, {}, []
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    ok = {}
    for name, side in sides.items():
        side.ids = ids
        t0 = time.time()
        try:
            losses[name] = warm(side, warmup, cfg.num_hidden_layers, notes, log)
        except Exception as e:  # noqa: BLE001 - the side is reported failed, the others go on
            errors[name] = one_line(e)[:600]
            log(f"  s{seq} {name}: failed: {errors[name]}")
            side.ids = None
            _free()
            continue
        ok[name] = side
        log(f"  s{seq} {name}: {warmup} warm-up step(s) in {time.time() - t0:.1f} s, first loss {losses[name]:.4f}")
    notes += R.loss_notes(losses)
    resident = torch.cuda.memory_allocated() / 2**30 if on_gpu else None
    times = timing.paired_times({n: s.step for n, s in ok.items()}, repeats, time_one=time_one, warmup=0) \
        if ok else {}
    splits = {}
    if on_gpu and profile_steps:
        for name, side in ok.items():
            try:
                splits[name] = profile_split(side.step, profile_steps)
            except Exception as e:  # noqa: BLE001 - the timings stand without the split
                notes.append(f"{name} split: {type(e).__name__}: {one_line(e)[:200]}")
    memory = {"resident": resident, "peak": torch.cuda.max_memory_allocated() / 2**30} if on_gpu else None
    for side in sides.values():
        side.ids = None
    del ids
    _free()
    return R.make_row(seq, batch, times, our_sides=OUR_SIDES, splits=splits, errors=errors, losses=losses,
                      notes=notes, memory=memory)


# ------------------------------------------------------------------------------------------ the run
def precompile(config, tokens, log=print) -> None:
    """Compile the attention forward / backward and every GEMM of the patched linears at each token count
    (forward y = x W^T, backward dx = dy W and dW^T = x^T dy) into the disk cache, in parallel processes.
    A configuration this misses compiles at its first step."""
    import torch

    from ...common import jit
    from .timing import warm_one

    h, f, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    d, hq, hkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    entries = [("flash_attn", {"dtype": torch.bfloat16, "head_dim": d, "causal": True}),
               ("flash_attn_backward", {"dtype": torch.bfloat16, "head_dim": d, "causal": True, "gqa": hq != hkv})]
    linears = dict.fromkeys([(hq * d, h), (hkv * d, h), (h, hq * d), (f, h), (h, f), (vocab, h)])  # (N, K)
    for t in dict.fromkeys(tokens):
        for n, k in linears:
            entries += [("gemm", {"m": t, "n": n, "k": k, "b_major": "col"}), ("gemm", {"m": t, "n": k, "k": n}),
                        ("gemm", {"m": k, "n": n, "k": t, "a_major": "col"})]
    t0 = time.time()
    try:
        errors = jit.precompile_in_processes(warm_one, entries)
    except Exception as e:  # noqa: BLE001 - the kernels then compile at first use
        errors = [f"parallel precompile failed: {type(e).__name__}: {one_line(e)[:200]}"]
    log(f"precompiled {len(entries)} attention / GEMM configurations in {time.time() - t0:.1f} s")
    for e in errors:
        log(f"  precompile error: {one_line(e)[:300]}")


def run(config, seqs, batch: int = 1, sides=SIDES, *, repeats: int = 10, warmup: int = 3, profile_steps: int = 1,
        seed: int = 0, device: str = "cuda", precompile_kernels: bool = True, time_one=None, log=print,
        quick: bool = False) -> dict:
    """The benchmark on ``config`` (a ``LlamaConfig``) at every length of ``seqs``; the results document.
    ``time_one`` replaces the paired timer's CUDA-event timing of one step (a CPU run of the tests)."""
    import transformers

    from .. import bench_model

    register_sides()
    if precompile_kernels:
        precompile(config, [batch * s for s in seqs], log)
    t0 = time.time()
    built = build_sides(config, list(sides), device, seed)
    params = sum(p.numel() for p in next(iter(built.values())).model.parameters())
    log(f"model: {config.num_hidden_layers} layers, {params / 1e9:.2f} B parameters, {len(built)} copies built in "
        f"{time.time() - t0:.1f} s")
    rows = []
    for seq in seqs:
        t1 = time.time()
        try:
            row = run_length(built, seq, batch, repeats=repeats, warmup=warmup, profile_steps=profile_steps,
                             seed=seed, time_one=time_one, log=log)
        except Exception as e:  # noqa: BLE001 - the other lengths still run and are written
            row = R.make_row(seq, batch, {}, our_sides=OUR_SIDES,
                             notes=[f"error: {type(e).__name__}: {one_line(e)[:300]}"])
            _free()
        rows.append(row)
        ran = {n: e for n, e in row["impls"].items() if "median_us" in e}
        log(f"s{seq}: " + ", ".join(f"{n} {e['median_us'] / 1e3:.1f} ms" for n, e in ran.items())
            + f"; attention ratio {R.ratio_text(row.get('attention_ratio'))} [{time.time() - t1:.0f} s]")
    shapes = {k: getattr(config, k, None) for k in bench_model.LLAMA3_8B}  # the Llama-3-8B ones unless a test's
    model_meta = {**shapes, "num_hidden_layers": config.num_hidden_layers, "dtype": "bfloat16", "parameters": params}
    meta = results.run_meta(TIMER, repeats, quick=quick, warmup=warmup, batch=batch, seqs=list(seqs), seed=seed,
                            sides=list(sides), model=model_meta, step=STEP_WORDS, sides_how=SIDES_WORDS,
                            split_how=SPLIT_WORDS.format(n=profile_steps), profile_steps=profile_steps)
    meta["versions"]["transformers"] = transformers.__version__
    del built
    _free()
    return R.document(meta, rows)


# ------------------------------------------------------------------------------------------- the CLI
def _lengths(s: str) -> tuple[int, ...]:
    """``"4k,8192"`` (k = 1024) -> distinct lengths >= 2."""
    try:
        out = [int(x[:-1]) * 1024 if x.endswith("k") else int(x) for x in s.strip().lower().split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (4k = 4096), got {s!r}") from None
    if min(out) < 2:
        raise argparse.ArgumentTypeError(f"lengths must be >= 2, got {s!r}")
    return tuple(dict.fromkeys(out))


def _sides(s: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in s.split(",") if x.strip()))
    bad = [n for n in names if n not in SIDES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown side(s) {bad or s!r}; known: {','.join(SIDES)}")
    return names


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    ap = OneLineParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 layer, length 1024, 3 repetitions after 2 warm-up steps")
    ap.add_argument("--layers", type=int_in(1, 32), default=None, help="decoder layers (default 4, quick 1)")
    ap.add_argument("--seqs", type=_lengths, default=None, help="comma-separated sequence lengths, 4k = 4096 "
                    "(default 4k,8k; quick 1024)")
    ap.add_argument("--batch", type=int_in(1), default=1, help="sequences per step, every side (default 1)")
    ap.add_argument("--repeats", type=int_in(1), default=None, help="paired repetitions (default 10, quick 3)")
    ap.add_argument("--warmup", type=int_in(1), default=None, help="untimed steps per side and length, the first "
                    "checked (default 3, quick 2)")
    ap.add_argument("--profile-steps", type=int_in(0), default=None, help="profiled steps per side for the split, "
                    "0: no split (default 1)")
    ap.add_argument("--sides", type=_sides, default=SIDES, help=f"comma-separated subset of {','.join(SIDES)}")
    ap.add_argument("--seed", type=int_in(0), default=0, help="weights and input ids (default 0)")
    ap.add_argument("--no-precompile", action="store_true", help="compile at first use, not in processes up front")
    ap.add_argument("--tag", default="", help=f"suffix of the file names after the kind ({KIND})")
    ap.add_argument("--out", "--out-dir", dest="out", default=os.path.join("profiles", "results"),
                    help="folder for the JSON and markdown (default profiles/results)")
    return ap


def parse_args(argv=None, prog: str = PROG) -> argparse.Namespace:
    a = build_parser(prog).parse_args(argv)
    for k, v in (QUICK if a.quick else DEFAULTS).items():  # unset options take the preset's value
        if getattr(a, k) is None:
            setattr(a, k, v)
    return a


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    if results.cuda_missing(prog) or results.transformers_missing(prog):
        return 2
    from ..bench_model import llama_config

    doc = run(llama_config(args.layers), args.seqs, args.batch, args.sides, repeats=args.repeats,
              warmup=args.warmup, profile_steps=args.profile_steps, seed=args.seed,
              precompile_kernels=not args.no_precompile, quick=args.quick)
    return results.publish(doc, args.out, args.tag or ("quick" if args.quick else ""), to_markdown=R.markdown)


"""``cute-kernels charts``: PNG charts of recorded benchmark results, on any machine (no GPU, no torch).

From results files (:mod:`.bench.records` reads this package's schema and the older per-script
formats of ``profiles/results/``):

- ``<kind>-<date>-<commit>-ratios.png`` per file: each implementation's speed relative to the best
  peer of its shape (best peer's time / its time; above 1 is faster), ours highlighted, the same-run
  ceiling marked (a black bar across the group);
- ``roofline.png``: the device's roofline from its measured read bandwidth and bf16 matmul rate
  (stated on the chart, with where they come from) and every kernel's point per shape (arithmetic
  intensity, achieved TFLOP/s), ours filled, the best peer hollow;
- ``summary.png``: the ratio panels and the roofline in one small picture (the README's);
- ``tables.md``: one table per kernel (ratio to the best peer, fraction of the ceiling), naming
  device, date, commit and file.

matplotlib comes with the ``pictures`` extra.
"""

from __future__ import annotations

import math
from pathlib import Path

from .bench import records, results

#: colours: ours stands out, peers in cool tones, variants grey
OURS_COLOR = "#d95f02"
PEER_COLORS = ["#1b9e77", "#7570b3", "#386cb0", "#66a61e", "#a6761d", "#e7298a"]
VARIANT_COLOR = "#bbbbbb"
KIND_MARKERS = {"gemm": "o", "attention": "s", "decode": "^"}
KIND_COLORS = {"gemm": "#d95f02", "attention": "#7570b3", "decode": "#1b9e77"}


class MissingExtra(RuntimeError):
    """matplotlib is not installed."""


def _figure(w: float, h: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingExtra("charts need matplotlib: pip install 'cute-kernels[pictures]'") from e
    return Figure(figsize=(w, h), layout="constrained")


def _label(doc: dict) -> str:
    m = doc["meta"]
    return f"{m.get('device', '?')}, {m.get('date', '?')}, commit {m.get('commit', '?')}"


def _bars(doc: dict) -> tuple[list[str], list[str], dict]:
    """(shapes, implementation names in draw order, {name: [speed vs best peer per shape or None]})."""
    shapes = [r["shape"] for r in doc["rows"]]
    names: list[str] = []
    for r in doc["rows"]:
        for n, e in r["impls"].items():
            if e.get("role") in ("ours", "peer") and e.get("median_us") and n not in names:
                names.append(n)
    names.sort(key=lambda n: (next(r["impls"][n]["role"] for r in doc["rows"] if n in r["impls"]) != "ours", n))
    vals = {n: [] for n in names}
    for r in doc["rows"]:
        best = r["impls"].get(r.get("best_peer") or "", {}).get("median_us")
        for n in names:
            e = r["impls"].get(n, {})
            vals[n].append(best / e["median_us"] if best and e.get("median_us") else None)
    return shapes, names, vals


def ratio_axes(ax, doc: dict, title: str | None = None) -> None:
    """Grouped bars on ``ax``: per shape, each implementation's best-peer time / its time; the ceiling
    (the same ratio for the ceiling's time) as a black bar across the group."""
    shapes, names, vals = _bars(doc)
    k = max(1, len(names))
    width = 0.8 / k
    pi = 0
    top = 1.0
    for i, n in enumerate(names):
        ours = any(r["impls"].get(n, {}).get("role") == "ours" for r in doc["rows"])
        color = OURS_COLOR if ours else PEER_COLORS[pi % len(PEER_COLORS)]
        pi += not ours
        xs = [j - 0.4 + width * (i + 0.5) for j in range(len(shapes))]
        ys = [v if v is not None else 0.0 for v in vals[n]]
        top = max([top, *ys])
        ax.bar(xs, ys, width=width * 0.95, color=color, label=n + (" (ours)" if ours else ""),
               edgecolor="black" if ours else "none", linewidth=0.6)
    cx, cy = [], []
    for j, r in enumerate(doc["rows"]):
        c = r["impls"].get(r.get("ceiling") or "", {})
        best = r["impls"].get(r.get("best_peer") or "", {}).get("median_us")
        if c.get("median_us") and best:
            cx.append(j)
            cy.append(best / c["median_us"])
    if cx:
        ax.hlines(cy, [x - 0.42 for x in cx], [x + 0.42 for x in cx], colors="black", linewidth=2.0,
                  label="ceiling (" + _ceiling_name(doc) + ")")
        top = max([top, *cy])
    ax.axhline(1.0, color="#555555", linewidth=0.7, linestyle="--")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([_short(s) for s in shapes], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, top * 1.4)  # room for the legend above the bars
    ax.set_ylabel("speed vs best peer (x)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title or f"{results.TITLES.get(doc['kind'], doc['kind'])} ({_label(doc)})", fontsize=9)
    ax.legend(fontsize=6, ncol=min(4, k + 1), loc="upper left", framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)


def _ceiling_name(doc: dict) -> str:
    names = sorted({r.get("ceiling") for r in doc["rows"] if r.get("ceiling") and r["impls"].get(r["ceiling"])})
    return ", ".join(n.split(" (")[0] for n in names) if len(names) <= 2 else "per shape"


def _short(shape: str) -> str:
    return shape.replace("_paged16", " paged").replace("_", " ")


def roofline_axes(ax, docs: list[dict], roofs: dict) -> None:
    """Log-log roofline on ``ax``: min(matmul rate, read bandwidth x intensity) and every row's point."""
    bw, mm = roofs.get("read_TBps"), roofs.get("matmul_TFLOPs")
    pts = []
    for d in docs:
        if d["kind"] not in KIND_MARKERS:
            continue
        for r in d["rows"]:
            if not (r.get("flops") and r.get("bytes")):
                continue
            ai = r["flops"] / r["bytes"]
            for n, e in r["impls"].items():
                if e.get("median_us") and (e.get("role") == "ours" or n == r.get("best_peer")):
                    pts.append((d["kind"], e.get("role") == "ours", ai, r["flops"] / e["median_us"] / 1e6))
    if not pts:
        ax.text(0.5, 0.5, "no rows with FLOPs and bytes", ha="center", transform=ax.transAxes)
        return
    lo = min(p[2] for p in pts) / 2
    hi = max(p[2] for p in pts) * 2
    if bw and mm:
        ridge = mm / bw
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(xs, [min(mm, bw * x) for x in xs], color="black", linewidth=1.5)
        x_bw = math.sqrt(lo * ridge)  # half-way up the bandwidth roof (log scale)
        ax.annotate(f"{bw:.2f} TB/s", xy=(x_bw, bw * x_bw), fontsize=7, ha="right", xytext=(-6, 4),
                    textcoords="offset points")
        ax.annotate(f"{mm:.0f} TFLOP/s", xy=(hi / 1.3, mm), fontsize=7, ha="right", xytext=(0, 4),
                    textcoords="offset points")
    for kind, marker in KIND_MARKERS.items():
        for ours in (True, False):
            sel = [p for p in pts if p[0] == kind and p[1] == ours]
            if sel:
                ax.scatter([p[2] for p in sel], [p[3] for p in sel], marker=marker, s=28 if ours else 22,
                           facecolors=KIND_COLORS[kind] if ours else "none", edgecolors=KIND_COLORS[kind],
                           linewidths=1.0, label=f"{kind} {'ours' if ours else 'best peer'}", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    y_lo = min(p[3] for p in pts) / 3
    ax.set_ylim(y_lo, max([mm or 0.0] + [p[3] for p in pts]) * 8)  # room above the roof for the roofs' text
    ax.set_xlabel("arithmetic intensity (FLOP / byte of DRAM traffic, each byte once)", fontsize=8)
    ax.set_ylabel("achieved TFLOP/s", fontsize=8)
    ax.tick_params(labelsize=7)
    dev = next((d["meta"].get("device") for d in docs if d["meta"].get("device")), "?")
    ax.set_title(f"Roofline, {dev}", fontsize=9)
    ax.legend(fontsize=6, loc="lower right", framealpha=0.85)
    ax.grid(which="both", alpha=0.25)
    how = roofs.get("how", "roofs not measured")
    ax.text(0.01, 0.99, "roofs: " + _wrap(how, 85), transform=ax.transAxes, fontsize=6.5, va="top",
            bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#999999"})


def _wrap(text: str, width: int) -> str:
    words, lines, cur = text.split(), [], ""
    for w in words:
        if cur and len(cur) + 1 + len(w) > width:
            lines.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}".strip()
    return "\n".join([*lines, cur])


def _stem(doc: dict) -> str:
    return Path(doc.get("source", doc["kind"])).stem


def readme_tables(docs: list[dict]) -> str:
    """One markdown table per kernel: ours, the best peer, our ratio to it, our fraction of the ceiling."""
    out = []
    for d in docs:
        if d["kind"] not in results.RATE:
            continue
        key, unit = results.RATE[d["kind"]]
        out += [f"**{results.TITLES[d['kind']]}** ({_label(d)}; `{d.get('source', '?')}`):", "",
                f"| shape | ours {unit} | best peer | x best peer | ceiling | of ceiling |", "|---|---|---|---|---|---|"]
        for r in d["rows"]:
            o = r["impls"].get(r.get("ours") or "", {})
            rate = o.get(key)
            rate_s = "-" if rate is None else f"{rate:.0f}" if unit == "TFLOP/s" else f"{rate:.2f}"
            best = r.get("ratio_vs_best_peer")
            c = r.get("ours_vs_ceiling")
            out.append(f"| {r['shape']} | {rate_s} | {r.get('best_peer') or '-'} | "
                       + ("-" if best is None else f"{best:.2f}x") + f" | {(r.get('ceiling') or '-')} | "
                       + ("-" if c is None else f"{c:.2f}") + " |")
        g = d.get("summary", {}).get("geomean_vs_best_peer")
        gc = d.get("summary", {}).get("geomean_vs_ceiling")
        line = f"Geomean x best peer: {g:.2f}x" if g else "Geomean x best peer: -"
        out += ["", line + (f"; of ceiling: {gc:.2f}." if gc else "."), ""]
    return "\n".join(out)


def make(paths: list[str | Path], out_dir: str | Path, dpi: int = 110, on_skip=print) -> list[Path]:
    """Write the charts (and ``tables.md``) of the results files ``paths`` into ``out_dir``; returns
    the files written.  A file of no known format (e.g. the model benchmark's) is skipped with
    ``on_skip(message)``; none known raises ValueError; no matplotlib raises :class:`MissingExtra`."""
    if not paths:
        raise ValueError("charts: name at least one results file (e.g. profiles/results/gemm-*.json)")
    docs, errors = [], []
    for p in paths:
        try:
            docs.append(records.load(p))
        except ValueError as e:
            errors.append(str(e))
    if not docs:
        raise ValueError(errors[0] if len(errors) == 1 else f"charts: no results file of a known format ({errors[0]})")
    for e in errors:
        on_skip(f"skipped {e}")
    records.attach_ceilings(docs)
    roofs = records.roofs(docs)
    kinds = [d for d in docs if d["kind"] in results.RATE]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for d in kinds:
        fig = _figure(max(6.0, 0.9 * len(d["rows"]) + 2), 3.6)
        ratio_axes(fig.add_subplot(), d)
        p = out / f"{_stem(d)}-ratios.png"
        fig.savefig(p, dpi=dpi)
        written.append(p)
    if kinds:
        fig = _figure(7.5, 5.0)
        roofline_axes(fig.add_subplot(), kinds, roofs)
        p = out / "roofline.png"
        fig.savefig(p, dpi=dpi)
        written.append(p)
        written.append(summary(kinds, roofs, out / "summary.png"))
        p = out / "tables.md"
        p.write_text(readme_tables(kinds) + "\n")
        written.append(p)
    return written


def summary(docs: list[dict], roofs: dict, path: Path, dpi: int = 90) -> Path:
    """The ratio panels of ``docs`` and the roofline in one picture (the README's)."""
    n = len(docs) + 1
    cols = 2
    rows = math.ceil(n / cols)
    fig = _figure(12.0, 3.9 * rows)
    grid = fig.add_gridspec(rows, cols)
    for i, d in enumerate(docs):
        ratio_axes(fig.add_subplot(grid[i // cols, i % cols]), d)
    roofline_axes(fig.add_subplot(grid[(n - 1) // cols, (n - 1) % cols]), docs, roofs)
    fig.savefig(path, dpi=dpi)
    return path

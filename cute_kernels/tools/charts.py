"""``cute-kernels charts``: PNG charts of recorded benchmark results, on any machine (no GPU, no torch).

From results files (:mod:`.bench.records` reads this package's schema and the older per-script
formats of ``profiles/results/``):

- ``<kind>-<date>-<commit>-ratios.png`` per file of the kinds with peers (gemm, attention,
  attention-varlen, attention-backward, decode, model-decode): each implementation's speed relative to the best peer of
  its shape (best peer's time / its time; above 1 is faster), ours highlighted, the same-run ceiling
  marked (a black bar across the group);
- ``read-ceiling-<date>-<commit>-reads.png`` per bare-read ceiling file: each target's bytes read per
  second by the bare reads, ours and the peers, the target's rate marked;
- ``gaps-<date>-<commit>-gaps.png`` per ``gaps`` file (issue 36's rows under the paired timer): each
  row's paired ratio to its reference, coloured by whether it meets the target, the target marked;
- ``roofline.png``: the device's roofline from its measured read bandwidth and bf16 matmul rate
  (stated on the chart, with where they come from) and every kernel's point per shape (arithmetic
  intensity, achieved TFLOP/s), ours filled, the best peer hollow;
- ``summary.png``: the ratio panels and the roofline in one small picture (the README's);
- ``tables.md``: one table per kernel (ratio to the best peer, fraction of the ceiling), per
  ceiling file and per gaps file, naming device, date, commit and file.

Every file named must be drawn: one of no known kind, or with nothing timed in it, is an error
(ValueError, one line) and nothing is written.

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
MET_COLOR = "#1b9e77"
BARE_READ_COLORS = ["#444444", "#888888", "#bbbbbb"]
#: the kinds on the roofline (rows with FLOPs and bytes)
KIND_MARKERS = {"gemm": "o", "attention": "s", "attention-varlen": "D", "attention-backward": "v", "decode": "^"}
KIND_COLORS = {"gemm": "#d95f02", "attention": "#7570b3", "attention-varlen": "#e7298a", "attention-backward": "#a6761d",
               "decode": "#1b9e77"}
#: every kind :func:`make` draws: those with peers (ratio charts), the bare-read ceilings and the gaps
READ_CEILING = "read-ceiling"
GAPS = "gaps"
DRAWN = (*results.RATE, READ_CEILING, GAPS)


class MissingExtra(RuntimeError):
    """matplotlib is not installed."""


def _figure(w: float, h: float):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:
        raise MissingExtra("charts need matplotlib: pip install 'cute-kernels[pictures]'") from e
    return Figure(figsize=(w, h), layout="constrained")


def _title(doc: dict) -> str:
    """The kind's title; a GEMM of another shape set than the issue's names its preset."""
    preset = doc["meta"].get("preset") if doc["kind"] == "gemm" else None
    return results.TITLES.get(doc["kind"], doc["kind"]) + (f", {preset} preset" if preset not in (None, "issue") else "")


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
    ax.set_title(title or f"{_title(doc)} ({_label(doc)})", fontsize=9)
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


def reads_axes(ax, doc: dict) -> None:
    """Grouped bars on ``ax``: per bare-read target, the bytes per second of each column of the run
    (the bare reads grey, ours highlighted, the peers coloured), the target's rate as a black bar."""
    rows = doc["rows"]
    names: list[str] = []
    for r in rows:
        names += [n for n in r.get("times_us") or {r["what"]: r["us"]} if n not in names]
    names.sort(key=lambda n: (not records.is_bare_read(n), not n.startswith("cute-kernels"), n))
    k = max(1, len(names))
    width = 0.8 / k
    bare = peer = 0
    top = 0.0
    for i, n in enumerate(names):
        if records.is_bare_read(n):
            color, bare = BARE_READ_COLORS[bare % len(BARE_READ_COLORS)], bare + 1
        elif n.startswith("cute-kernels"):
            color = OURS_COLOR
        else:
            color, peer = PEER_COLORS[peer % len(PEER_COLORS)], peer + 1
        ys = [r["bytes"] / t / 1e6 if (t := (r.get("times_us") or {r["what"]: r["us"]}).get(n)) else 0.0
              for r in rows]
        top = max([top, *ys])
        ax.bar([j - 0.4 + width * (i + 0.5) for j in range(len(rows))], ys, width=width * 0.95, color=color,
               label=n + (" (ours)" if n.startswith("cute-kernels") else ""),
               edgecolor="black" if n.startswith("cute-kernels") else "none", linewidth=0.6)
    tx = [(j, r["bytes"] / r["target_us"] / 1e6) for j, r in enumerate(rows) if r.get("target_us")]
    if tx:
        ax.hlines([y for _, y in tx], [j - 0.42 for j, _ in tx], [j + 0.42 for j, _ in tx], colors="black",
                  linewidth=2.0, label="target")
        top = max([top, *(y for _, y in tx)])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["label"].split(" (")[0] for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, top * 1.45)  # room for the legend above the bars
    ax.set_ylabel("bytes read per second (TB/s)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"Bare-read ceilings ({_label(doc)})", fontsize=9)
    ax.legend(fontsize=6, ncol=min(4, k + 1), loc="upper left", framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)


def gaps_axes(ax, doc: dict) -> None:
    """Bars on ``ax``: per row of a ``gaps`` document, its paired ratio (the reference's time / ours;
    decode: of the bare read + merge), green where it meets the target, orange where not, grey where
    not judged; the target as a black bar across it."""
    from matplotlib.patches import Patch

    rows = doc["rows"]
    ys = [r.get("ratio") or 0.0 for r in rows]
    colors = [MET_COLOR if r.get("met") else OURS_COLOR if r.get("met") is False else VARIANT_COLOR for r in rows]
    ax.bar(range(len(rows)), ys, width=0.6, color=colors, edgecolor="black", linewidth=0.6)
    for j, (r, y) in enumerate(zip(rows, ys)):  # the figure above the bar and its target
        text = f"{y:.2f}" if y else "failed" if r.get("error") else "not judged"
        ax.annotate(text, xy=(j, max(y, r["target"])), ha="center", va="bottom", fontsize=6.5, xytext=(0, 3),
                    textcoords="offset points")
    ax.hlines([r["target"] for r in rows], [j - 0.4 for j in range(len(rows))], [j + 0.4 for j in range(len(rows))],
              colors="black", linewidth=2.0)
    ax.axhline(1.0, color="#555555", linewidth=0.7, linestyle="--")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([_short(r["shape"]) for r in rows], rotation=30, ha="right", fontsize=7)
    ax.set_ylim(0, max([1.0, *ys, *(r["target"] for r in rows)]) * 1.35)  # room for the legend
    ax.set_ylabel("reference time / ours (paired)", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"{_title(doc)} ({_label(doc)})", fontsize=9)
    ax.legend(handles=[Patch(color=MET_COLOR, label="met"), Patch(color=OURS_COLOR, label="not met"),
                       Patch(color=VARIANT_COLOR, label="not judged"), Patch(color="black", label="target")],
              fontsize=6, ncol=4, loc="upper left", framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)


def gaps_tables(docs: list[dict]) -> str:
    """One markdown table per ``gaps`` file: each row's paired ratio, its target and whether it is met."""
    out = []
    for d in docs:
        out += [f"**{_title(d)}** ({_label(d)}; `{d.get('source', '?')}`):", "",
                "| workload | reference | ratio | target | met |", "|---|---|---|---|---|"]
        for r in d["rows"]:
            ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3f}"
            met = {True: "yes", False: "no", None: "not judged"}[r.get("met")]
            out.append(f"| {r.get('workload', r['shape'])} | {r.get('reference', '-')} | {ratio} | {r['target']} | "
                       f"{met} |")
        out.append("")
    return "\n".join(out)


def ceiling_tables(docs: list[dict]) -> str:
    """One markdown table per bare-read ceiling file: each target's fastest bare read beside ours."""
    out = []
    for d in docs:
        out += [f"**Bare-read ceilings** ({_label(d)}; `{d.get('source', '?')}`):", "",
                "| target | bytes | fastest bare read | us | TB/s | ours us | target |", "|---|---|---|---|---|---|---|"]
        for r in d["rows"]:
            ours = {n: t for n, t in (r.get("times_us") or {}).items() if n.startswith("cute-kernels")}
            o = min(ours.values()) if ours else None
            out.append(f"| {r['label']} | {r['bytes']} | {r['what']} | {r['us']:.1f} | {r['TBps']:.2f} | "
                       + ("-" if o is None else f"{o:.1f}") + f" | {r.get('target') or '-'} |")
        out.append("")
    return "\n".join(out)


def _stem(doc: dict) -> str:
    return Path(doc.get("source", doc["kind"])).stem


def readme_tables(docs: list[dict]) -> str:
    """One markdown table per kernel: ours, the best peer, our ratio to it, our fraction of the ceiling."""
    out = []
    for d in docs:
        if d["kind"] not in results.RATE:
            continue
        key, unit = results.RATE[d["kind"]]
        out += [f"**{_title(d)}** ({_label(d)}; `{d.get('source', '?')}`):", "",
                f"| shape | ours {unit} | best peer | x best peer | ceiling | of ceiling |", "|---|---|---|---|---|---|"]
        for r in d["rows"]:
            o = r["impls"].get(r.get("ours") or "", {})
            rate = o.get(key)
            rate_s = "-" if rate is None else f"{rate:.2f}" if unit == "TB/s" else f"{rate:.0f}"
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


def _timed(doc: dict) -> bool:
    """Whether a document has anything to draw: a row with a time."""
    if doc["kind"] == READ_CEILING:
        return any(r.get("us") for r in doc["rows"])
    return any(e.get("median_us") for r in doc["rows"] for e in r["impls"].values())


def load_all(paths: list[str | Path]) -> list[dict]:
    """The documents of ``paths``; ValueError (one line) for the first that cannot be drawn: unreadable,
    of no known kind, or with nothing timed."""
    if not paths:
        raise ValueError("charts: name at least one results file (e.g. profiles/results/gemm-*.json)")
    docs = []
    for p in paths:
        d = records.load(p)
        if d["kind"] not in DRAWN:
            raise ValueError(f"{p}: a {d['kind']!r} results file; charts draws {', '.join(DRAWN)}")
        if not _timed(d):
            raise ValueError(f"{p}: no timed row to draw ({len(d['rows'])} rows)")
        docs.append(d)
    return docs


def make(paths: list[str | Path], out_dir: str | Path, dpi: int = 110) -> list[Path]:
    """Write the charts (and ``tables.md``) of the results files ``paths`` into ``out_dir``; returns
    the files written.  Every file is drawn or nothing is: one that cannot be (:func:`load_all`)
    raises ValueError before anything is written; no matplotlib raises :class:`MissingExtra`."""
    docs = load_all(paths)
    _figure(1, 1)  # MissingExtra before the folder is made
    records.attach_ceilings(docs)
    roofs = records.roofs(docs)
    kinds = [d for d in docs if d["kind"] in results.RATE]
    reads = [d for d in docs if d["kind"] == READ_CEILING]
    gaps = [d for d in docs if d["kind"] == GAPS]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    # one picture per file: (its documents, axes drawer, file suffix, width per row, height)
    for group, draw, suffix, per_row, height in ((kinds, ratio_axes, "ratios", 0.9, 3.6),
                                                 (reads, reads_axes, "reads", 1.1, 3.8),
                                                 (gaps, gaps_axes, "gaps", 0.9, 3.6)):
        for d in group:
            fig = _figure(max(6.0, per_row * len(d["rows"]) + 2), height)
            draw(fig.add_subplot(), d)
            p = out / f"{_stem(d)}-{suffix}.png"
            fig.savefig(p, dpi=dpi)
            written.append(p)
    on_roofline = [d for d in kinds if d["kind"] in KIND_MARKERS]
    if on_roofline:
        fig = _figure(7.5, 5.0)
        roofline_axes(fig.add_subplot(), on_roofline, roofs)
        p = out / "roofline.png"
        fig.savefig(p, dpi=dpi)
        written.append(p)
        written.append(summary(kinds, roofs, out / "summary.png"))
    p = out / "tables.md"
    p.write_text("\n".join(t for t in (readme_tables(kinds), ceiling_tables(reads), gaps_tables(gaps)) if t) + "\n")
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

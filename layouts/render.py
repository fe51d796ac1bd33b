"""Draw the explorer's tables (anything with ``grid()``, or a :class:`~layouts.explore.Grid`) as text,
SVG or PNG.  Text shows every label; pictures colour cells by key (thread, bank group, CTA, ...) and
stay under 300 KB for 8192-cell tiles: equal neighbours merge into runs, one ``<path>`` per colour,
and large grids label runs, where the text fits.  matplotlib is imported only for PNGs.
"""

from __future__ import annotations

import base64
import colorsys
import io
import os
import struct
import zlib
from typing import Any
from xml.sax.saxutils import escape

from .explore import Grid

MAX_BYTES = 300_000
DENSE_CELLS = 2048  # above this, label runs rather than cells
MAX_VECTOR_RUNS = 3000  # above this, the SVG colour layer is an embedded image

# Eight well-separated light colours for small key sets (bank groups, warps): ColorBrewer Set3.
_PASTEL8 = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5")


def as_grid(obj: Any, **kwargs: Any) -> Grid:
    """``obj`` itself if it is a Grid, else ``obj.grid(**kwargs)``."""
    if isinstance(obj, Grid):
        return obj
    if hasattr(obj, "grid"):
        return obj.grid(**kwargs)
    raise TypeError(f"cannot render {type(obj).__name__}: expected a Grid or a table with .grid()")


def color(key: int | None, num_keys: int, palette: str = "distinct") -> str:
    """Fill colour of a key.  'distinct': the 8 pastels for small sets, else golden-ratio hues so that
    neighbouring keys (threads 0 and 1) contrast; 'ramp': hue follows the key's order (offsets,
    visit order), so a layout's traversal reads as a gradient."""
    if key is None or key < 0:
        return "#ffffff"
    if palette == "ramp":
        hue, sat, val = 0.8 * key / max(1, num_keys - 1), 0.5, 1.0
    elif num_keys <= 8:
        return _PASTEL8[key % 8]
    else:
        hue = (key * 0.618033988749895) % 1.0
        sat, val = 0.35 + 0.15 * ((key // 3) % 2), 1.0 - 0.06 * (key % 3)
    r, g, b = colorsys.hsv_to_rgb(hue, sat, val)
    return "#%02x%02x%02x" % (round(r * 255), round(g * 255), round(b * 255))


def _colors(g: Grid) -> list[list[str]]:
    cache: dict = {}
    out = []
    for row in g.keys:
        out.append([cache[k] if k in cache else cache.setdefault(k, color(k, g.num_keys, g.palette)) for k in row])
    return out


def _png_bytes(rgb: list[list[str]], sx: int = 1, sy: int = 1) -> bytes:
    """A minimal RGB PNG of the cell colours, each cell ``sx`` x ``sy`` pixels (stdlib only): the colour
    layer of SVGs with too many runs for vector paths.  Drawn at full size, not scaled by the viewer,
    so no renderer blurs it; repeated rows use the PNG 'Up' filter and compress to almost nothing."""
    rows = []
    for row in rgb:
        line = bytes.fromhex("".join(c[1:] * sx for c in row))
        sub = bytes(line[:3]) + bytes((line[i] - line[i - 3]) & 0xFF for i in range(3, len(line)))
        rows.append(b"\x01" + sub)  # 'Sub' filter: runs of equal pixels become zeros
        rows.extend([b"\x02" + bytes(len(line))] * (sy - 1))  # 'Up' filter: same as the row above

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    head = struct.pack(">IIBBBBB", len(rgb[0]) * sx, len(rgb) * sy, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"".join(rows), 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _runs(grid: Grid) -> list[tuple[int, int, int, int | None]]:
    """Maximal horizontal runs of equal key: (row, col0, length, key)."""
    out = []
    for r, row in enumerate(grid.keys):
        c0 = 0
        for c in range(1, len(row) + 1):
            if c == len(row) or row[c] != row[c0]:
                out.append((r, c0, c - c0, row[c0]))
                c0 = c
    return out


# ---- text ---------------------------------------------------------------------------------------


def to_text(obj: Any, **kwargs: Any) -> str:
    """An ASCII table: title, notes, column indices on top, row indices on the left."""
    g = as_grid(obj, **kwargs)
    w = max([len(s) for row in g.labels for s in row] + [len(str(g.cols - 1))])
    rw = max(len(str(g.rows - 1)), len(g.row_name))
    lines = [g.title, *(f"  {n}" for n in g.notes), f"  rows: {g.row_name}, columns: {g.col_name}"]
    lines.append(" " * rw + " | " + " ".join(str(c).rjust(w) for c in range(g.cols)))
    lines.append("-" * rw + "-+-" + "-" * ((w + 1) * g.cols - 1))
    for r, row in enumerate(g.labels):
        lines.append(str(r).rjust(rw) + " | " + " ".join(s.rjust(w) for s in row))
    return "\n".join(lines) + "\n"


# ---- SVG ----------------------------------------------------------------------------------------


class SvgImage:
    """An SVG document; shows itself in notebooks (``_repr_svg_``)."""

    def __init__(self, data: str):
        self.data = data

    def _repr_svg_(self) -> str:
        return self.data

    def __str__(self) -> str:
        return self.data

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.data)


def _svg(g: Grid, labels: bool) -> str:
    dense = g.rows * g.cols > DENSE_CELLS
    cell_labels = g.short if (dense and g.short is not None) else g.labels
    if dense:
        cw = ch = 10
        font = 7
    else:
        longest = max(len(s) for row in cell_labels for s in row)
        font = 10
        cw, ch = max(18, 6 * longest + 6), 16
    left, top = 8 + 7 * max(len(str(g.rows - 1)), 2), 44
    text_w = max([7 * len(g.title) + 8, 6 * len(f"{g.row_name} {g.col_name} colour: {g.key_name}") + left + 30]
                 + [6 * len(n) + 8 for n in g.notes])
    W, H = max(left + cw * g.cols + 10, text_w), top + ch * g.rows + 16 + 13 * len(g.notes)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'font-family="monospace">',
        f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="4" y="14" font-size="12">{escape(g.title)}</text>',
    ]
    runs = _runs(g)
    rgb = _colors(g)
    if len(runs) <= MAX_VECTOR_RUNS:  # vector: one path per colour
        paths: dict[str, list[str]] = {}
        for r, c0, n, _ in runs:
            paths.setdefault(rgb[r][c0], []).append(f"M{left + c0 * cw} {top + r * ch}h{n * cw}v{ch}h{-n * cw}z")
        for fill, segs in paths.items():
            out.append(f'<path fill="{fill}" d="{"".join(segs)}"/>')
    else:  # many small runs (e.g. one colour per offset): a 1-pixel-per-cell image, scaled up
        b64 = base64.b64encode(_png_bytes(rgb, cw, ch)).decode()
        out.append(f'<image x="{left}" y="{top}" width="{cw * g.cols}" height="{ch * g.rows}" '
                   f'xlink:href="data:image/png;base64,{b64}"/>')
    # thin grid lines, one path
    d = [f"M{left} {top + r * ch}h{cw * g.cols}" for r in range(g.rows + 1)]
    d += [f"M{left + c * cw} {top}v{ch * g.rows}" for c in range(g.cols + 1)]
    out.append(f'<path fill="none" stroke="#888888" stroke-width="0.3" d="{"".join(d)}"/>')
    # axis indices (every 8th when dense)
    step = 8 if dense else 1
    fs = font
    out.append(f'<g font-size="{fs}" fill="#444444" text-anchor="middle">')
    out += [f'<text x="{left + c * cw + cw // 2}" y="{top - 4}">{c}</text>' for c in range(0, g.cols, step)]
    out.append("</g>")
    out.append(f'<g font-size="{fs}" fill="#444444" text-anchor="end">')
    out += [f'<text x="{left - 3}" y="{top + r * ch + ch - 3}">{r}</text>' for r in range(0, g.rows, step)]
    out.append("</g>")
    out.append(f'<text x="{left}" y="{top - 18}" font-size="10" fill="#444444">'
               f'{escape(g.row_name)} \u2193  {escape(g.col_name)} \u2192  colour: {escape(g.key_name)}</text>')
    if labels:
        out.append(f'<g font-size="{font}" text-anchor="middle">')
        char_w = 0.62 * font
        if dense:  # one label per run, if (nearly) all fit: a few stray labels would mislead
            fits = [(r, c0, n) for r, c0, n, _ in runs if len(cell_labels[r][c0]) * char_w <= n * cw - 1]
            for r, c0, n in fits if len(fits) >= 0.9 * len(runs) else ():
                out.append(f'<text x="{left + c0 * cw + n * cw // 2}" y="{top + r * ch + ch - 2}">'
                           f'{escape(cell_labels[r][c0])}</text>')
        else:
            for r, row in enumerate(cell_labels):
                for c, s in enumerate(row):
                    out.append(f'<text x="{left + c * cw + cw // 2}" y="{top + r * ch + ch - 4}">{escape(s)}</text>')
        out.append("</g>")
    y = top + ch * g.rows + 14
    for note in g.notes:
        out.append(f'<text x="4" y="{y}" font-size="10">{escape(note)}</text>')
        y += 13
    out.append("</svg>")
    return "\n".join(out)


def to_svg(obj: Any, **kwargs: Any) -> SvgImage:
    """Coloured grid as SVG (labels dropped if they would push it past ``MAX_BYTES``)."""
    g = as_grid(obj, **kwargs)
    data = _svg(g, labels=True)
    if len(data.encode()) > MAX_BYTES:
        data = _svg(g, labels=False)
    return SvgImage(data)


# ---- PNG ----------------------------------------------------------------------------------------


def to_png(obj: Any, **kwargs: Any) -> bytes:
    """Coloured grid as PNG bytes, drawn with matplotlib (Agg), palette-quantized to stay small."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb

    g = as_grid(obj, **kwargs)
    dense = g.rows * g.cols > DENSE_CELLS
    cell_labels = g.short if (dense and g.short is not None) else g.labels
    longest = max(len(s) for row in cell_labels for s in row)
    cell_in = 0.13 if dense else max(0.3, 0.075 * longest + 0.08)
    fig_w = min(22.0, 1.2 + cell_in * g.cols)
    fig_h = min(22.0, 1.4 + 0.13 * len(g.notes) + (0.13 if dense else 0.26) * g.rows)
    rgb = [[to_rgb(c) for c in row] for row in _colors(g)]
    data = b""
    for dpi, labels in ((100, True), (100, False), (70, False), (50, False)):
        fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=dpi)
        ax.imshow(rgb, interpolation="nearest", aspect="auto")
        ax.set_title(g.title, fontsize=9, loc="left")
        ax.set_xlabel(f"{g.col_name}   (colour: {g.key_name})", fontsize=8)
        ax.set_ylabel(g.row_name, fontsize=8)
        ax.set_xticks(range(0, g.cols, 8 if dense else max(1, g.cols // 32)))
        ax.set_yticks(range(0, g.rows, 8 if dense else max(1, g.rows // 32)))
        ax.tick_params(labelsize=6, top=True, labeltop=True, bottom=False, labelbottom=False)
        ax.set_xticks([c - 0.5 for c in range(g.cols + 1)], minor=True)
        ax.set_yticks([r - 0.5 for r in range(g.rows + 1)], minor=True)
        ax.grid(which="minor", color="#888888", linewidth=0.2)
        ax.tick_params(which="minor", length=0)
        if g.notes:
            fig.text(0.01, 0.005, "\n".join(g.notes), fontsize=6, va="bottom", family="monospace")
        # laid out before the cell labels: they sit inside the axes, and measuring thousands of them
        # for the layout cost more than drawing them
        fig.tight_layout(rect=(0, 0.012 * len(g.notes) + 0.01, 1, 1))
        pt_per_cell = (fig_w - 1.2) * 72 / g.cols
        fs = 5 if dense else 6
        if labels and dense:  # one label per run, if (nearly) all fit
            runs = _runs(g)
            fits = [(r, c0, n) for r, c0, n, _ in runs if len(cell_labels[r][c0]) * 0.62 * fs <= n * pt_per_cell]
            for r, c0, n in fits if len(fits) >= 0.9 * len(runs) else ():
                ax.text(c0 + (n - 1) / 2, r, cell_labels[r][c0], ha="center", va="center", fontsize=fs)
        elif labels and 0.62 * fs * longest <= pt_per_cell:
            for r, row in enumerate(cell_labels):
                for c, s in enumerate(row):
                    ax.text(c, r, s, ha="center", va="center", fontsize=fs)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        plt.close(fig)
        data = _quantize(buf.getvalue())
        if len(data) <= MAX_BYTES:
            break
    return data


def _quantize(png: bytes) -> bytes:
    """Re-encode with a 256-colour palette (matplotlib writes RGBA; the cells use few colours)."""
    try:
        from PIL import Image
    except ImportError:  # matplotlib depends on Pillow, but stay correct without it
        return png
    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=True)
    return out.getvalue()


# ---- dispatch -----------------------------------------------------------------------------------

FORMATS = ("text", "svg", "png")


def format_from_path(path: str | os.PathLike) -> str:
    ext = os.path.splitext(str(path))[1].lower()
    return {".svg": "svg", ".png": "png", ".txt": "text"}.get(ext, "text")


def render(obj: Any, fmt: str = "text", **kwargs: Any) -> str | bytes:
    """``'text'`` and ``'svg'`` give ``str``, ``'png'`` gives ``bytes``."""
    if fmt == "text":
        return to_text(obj, **kwargs)
    if fmt == "svg":
        return to_svg(obj, **kwargs).data
    if fmt == "png":
        return to_png(obj, **kwargs)
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


def save(obj: Any, path: str | os.PathLike, fmt: str | None = None, **kwargs: Any) -> str:
    """Write ``obj`` to ``path`` (format from the extension unless given); returns the format."""
    fmt = fmt or format_from_path(path)
    data = render(obj, fmt, **kwargs)
    if isinstance(data, bytes):
        with open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write(data)
    return fmt


__all__ = ["SvgImage", "as_grid", "color", "to_text", "to_svg", "to_png", "render", "save", "format_from_path"]

"""A PNG line plot without matplotlib (Debian's /usr/bin/python3 here has none): an RGB canvas,
lines, rectangles, a 5x7 bitmap font, and a PNG writer (zlib + struct, standard library only).

plot.loss_png(path, series, ...) draws held-out loss against step for every configuration: the
whole run on the left, the second half of the steps magnified on the right, and a legend."""

import struct
import zlib

# 5x7 glyphs, one string of 5 cells per row ('#' = ink); g, j, p, q, y have an eighth row (their
# descender). Upper case letters are drawn as lower case.
_FONT = {
    " ": ["....."] * 7,
    "0": [".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."],
    "1": ["..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "2": [".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"],
    "3": ["####.", "....#", "....#", ".###.", "....#", "....#", "####."],
    "4": ["...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."],
    "5": ["#####", "#....", "####.", "....#", "....#", "#...#", ".###."],
    "6": [".###.", "#....", "#....", "####.", "#...#", "#...#", ".###."],
    "7": ["#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."],
    "8": [".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."],
    "9": [".###.", "#...#", "#...#", ".####", "....#", "....#", ".###."],
    "a": [".....", ".....", ".###.", "....#", ".####", "#...#", ".####"],
    "b": ["#....", "#....", "####.", "#...#", "#...#", "#...#", "####."],
    "c": [".....", ".....", ".####", "#....", "#....", "#....", ".####"],
    "d": ["....#", "....#", ".####", "#...#", "#...#", "#...#", ".####"],
    "e": [".....", ".....", ".###.", "#...#", "#####", "#....", ".###."],
    "f": ["..##.", ".#...", "####.", ".#...", ".#...", ".#...", ".#..."],
    "g": [".....", ".....", ".####", "#...#", "#...#", ".####", "....#", ".###."],
    "h": ["#....", "#....", "####.", "#...#", "#...#", "#...#", "#...#"],
    "i": ["..#..", ".....", ".##..", "..#..", "..#..", "..#..", ".###."],
    "j": ["...#.", ".....", "..##.", "...#.", "...#.", "...#.", "#..#.", ".##.."],
    "k": ["#....", "#....", "#..#.", "#.#..", "##...", "#.#..", "#..#."],
    "l": [".##..", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."],
    "m": [".....", ".....", "##.#.", "#.#.#", "#.#.#", "#.#.#", "#.#.#"],
    "n": [".....", ".....", "####.", "#...#", "#...#", "#...#", "#...#"],
    "o": [".....", ".....", ".###.", "#...#", "#...#", "#...#", ".###."],
    "p": [".....", ".....", "####.", "#...#", "#...#", "####.", "#....", "#...."],
    "q": [".....", ".....", ".####", "#...#", "#...#", ".####", "....#", "....#"],
    "r": [".....", ".....", "#.##.", "##..#", "#....", "#....", "#...."],
    "s": [".....", ".....", ".####", "#....", ".###.", "....#", "####."],
    "t": [".#...", ".#...", "####.", ".#...", ".#...", ".#..#", "..##."],
    "u": [".....", ".....", "#...#", "#...#", "#...#", "#..##", ".##.#"],
    "v": [".....", ".....", "#...#", "#...#", "#...#", ".#.#.", "..#.."],
    "w": [".....", ".....", "#...#", "#...#", "#.#.#", "#.#.#", ".#.#."],
    "x": [".....", ".....", "#...#", ".#.#.", "..#..", ".#.#.", "#...#"],
    "y": [".....", ".....", "#...#", "#...#", "#...#", ".####", "....#", ".###."],
    "z": [".....", ".....", "#####", "...#.", "..#..", ".#...", "#####"],
    "-": [".....", ".....", ".....", "#####", ".....", ".....", "....."],
    "+": [".....", "..#..", "..#..", "#####", "..#..", "..#..", "....."],
    ".": [".....", ".....", ".....", ".....", ".....", ".##..", ".##.."],
    ",": [".....", ".....", ".....", ".....", ".##..", "..#..", ".#..."],
    ":": [".....", ".##..", ".##..", ".....", ".##..", ".##..", "....."],
    "(": ["...#.", "..#..", ".#...", ".#...", ".#...", "..#..", "...#."],
    ")": [".#...", "..#..", "...#.", "...#.", "...#.", "..#..", ".#..."],
    "%": ["##...", "##..#", "...#.", "..#..", ".#...", "#..##", "...##"],
    "/": [".....", "....#", "...#.", "..#..", ".#...", "#....", "....."],
    "_": [".....", ".....", ".....", ".....", ".....", ".....", "#####"],
    "=": [".....", ".....", "#####", ".....", "#####", ".....", "....."],
}

# Distinct colours for up to 12 series (the first, the baseline, black).
PALETTE = [(0, 0, 0), (230, 25, 75), (60, 140, 60), (0, 100, 200), (245, 130, 48), (145, 30, 180),
           (70, 190, 190), (200, 40, 200), (128, 128, 0), (0, 0, 128), (170, 110, 40), (128, 128, 128)]


class Canvas:
    """An RGB image, white, width x height; (0, 0) is the top left pixel."""

    def __init__(self, width, height):
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def set(self, x, y, rgb):
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(rgb)

    def rect(self, x0, y0, x1, y1, rgb):
        """Fills the rectangle [x0, x1] x [y0, y1]."""
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, rgb)

    def line(self, x0, y0, x1, y1, rgb, width=1, clip=None):
        """A line from (x0, y0) to (x1, y1) (floats), `width` pixels thick, drawn only inside clip
        (x0, y0, x1, y1) when given."""
        steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        r = (width - 1) // 2
        for i in range(steps + 1):
            t = i / steps
            x = int(round(x0 + (x1 - x0) * t))
            y = int(round(y0 + (y1 - y0) * t))
            for dx in range(-r, width - r):
                for dy in range(-r, width - r):
                    px, py = x + dx, y + dy
                    if clip and not (clip[0] <= px <= clip[2] and clip[1] <= py <= clip[3]):
                        continue
                    self.set(px, py, rgb)

    def text(self, x, y, s, rgb=(0, 0, 0), scale=2):
        """s in the 5x7 font, its top left at (x, y), each cell scale x scale pixels; returns the
        x after the last character."""
        for ch in s:
            glyph = _FONT.get(ch.lower(), _FONT[" "]) or _FONT[" "]
            for row, cells in enumerate(glyph):
                for col, c in enumerate(cells):
                    if c == "#":
                        self.rect(x + col * scale, y + row * scale, x + col * scale + scale - 1,
                                  y + row * scale + scale - 1, rgb)
            x += 6 * scale
        return x

    def png(self):
        """The image as PNG bytes (8-bit RGB, no filter)."""
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s, scale=2):
    return 6 * scale * len(s)


def nice_ticks(lo, hi, count=5):
    """Round tick values covering [lo, hi], about `count` of them."""
    import math
    span = hi - lo if hi > lo else abs(hi) or 1.0
    raw = span / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 10))
        v += step
    return ticks, step


def _fmt(v, step):
    if step >= 1:
        return f"{v:.0f}"
    decimals = 0
    while step * 10 ** decimals < 1 - 1e-9 and decimals < 6:
        decimals += 1
    return f"{v:.{decimals}f}"


def _panel(c, box, series, x_range, y_range, title):
    """Axes, ticks, grid and the series inside box = (left, top, right, bottom)."""
    left, top, right, bottom = box
    (x0, x1), (y0, y1) = x_range, y_range
    grid, axis = (225, 225, 225), (0, 0, 0)

    def sx(v):
        return left + (v - x0) / (x1 - x0) * (right - left)

    def sy(v):
        return bottom - (v - y0) / (y1 - y0) * (bottom - top)
    xt, xs = nice_ticks(x0, x1)
    yt, ys = nice_ticks(y0, y1)
    for v in xt:
        c.line(sx(v), top, sx(v), bottom, grid)
        label = _fmt(v, xs)
        c.text(int(sx(v) - text_width(label) / 2), bottom + 8, label)
    for v in yt:
        c.line(left, sy(v), right, sy(v), grid)
        label = _fmt(v, ys)
        c.text(left - text_width(label) - 8, int(sy(v) - 7), label)
    c.line(left, top, left, bottom, axis)
    c.line(left, bottom, right, bottom, axis)
    c.line(right, top, right, bottom, axis)
    c.line(left, top, right, top, axis)
    c.text(left, top - 24, title)
    clip = (left + 1, top + 1, right - 1, bottom - 1)
    for i, (name, points) in enumerate(series):
        pts = [(sx(x), sy(y)) for x, y in points]
        rgb = PALETTE[i % len(PALETTE)]
        for (ax, ay), (bx, by) in zip(pts, pts[1:]):
            c.line(ax, ay, bx, by, rgb, width=3 if i == 0 else 2, clip=clip)


def loss_png(path, series, title="held-out loss (nats per byte) against step", zoom_from=0.5):
    """Writes the plot: series = [(name, [(step, loss), ...]), ...], the first drawn thickest."""
    series = [(n, [(float(x), float(y)) for x, y in pts]) for n, pts in series if pts]
    if not series:
        raise ValueError("loss_png: no series to draw")
    w, h = 1500, 760
    c = Canvas(w, h)
    c.text(20, 14, title, scale=3)
    xmax = max(x for _, pts in series for x, _ in pts) or 1.0
    ys = [y for _, pts in series for _, y in pts]
    _panel(c, (110, 90, 650, 640), series, (0.0, xmax), (min(ys) - 0.05 * (max(ys) - min(ys) or 1),
                                                         max(ys) + 0.05 * (max(ys) - min(ys) or 1)),
           "the whole run")
    z0 = xmax * zoom_from
    zs = [y for _, pts in series for x, y in pts if x >= z0]
    lo, hi = (min(zs), max(zs)) if zs else (min(ys), max(ys))
    pad = 0.08 * (hi - lo) if hi > lo else 0.01 * abs(hi) or 0.01
    zoomed = [(n, [(x, y) for x, y in pts if x >= z0 - (xmax - z0) * 0.02]) for n, pts in series]
    _panel(c, (770, 90, 1200, 640), zoomed, (z0, xmax), (lo - pad, hi + pad),
           f"steps {z0:.0f} to {xmax:.0f}")
    c.text(110, 690, "step", scale=2)
    c.text(770, 690, "step", scale=2)
    y = 96
    for i, (name, _) in enumerate(series):
        rgb = PALETTE[i % len(PALETTE)]
        c.rect(1230, y + 5, 1260, y + 8, rgb)
        c.text(1270, y, name)
        y += 28
    with open(path, "wb") as f:
        f.write(c.png())

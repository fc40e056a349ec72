"""Render a terminal capture (``tmux capture-pane -p -e``) to a PNG, for the README.

    python docs/terminal_png.py capture.ansi docs/status-line.png [--columns 80]

The capture is replayed on a terminal emulator (pyte, from the test extra), written out as
HTML with its colours, and photographed by headless Chromium, so the picture is what the
terminal showed, character for character.
"""

from __future__ import annotations

import argparse
import html
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyte

COLOURS = {
    "default": "#d0d0d0",
    "black": "#1c1c1c",
    "red": "#e05a5a",
    "green": "#5fd75f",
    "brown": "#d7af5f",
    "yellow": "#d7d75f",
    "blue": "#5f87d7",
    "magenta": "#af87d7",
    "cyan": "#5fd7d7",
    "white": "#eeeeee",
}
BACKGROUND = "#1c1c1c"
CELL_W, CELL_H = 8.4, 18  # pixels per character cell at 14px monospace


def to_html(capture: bytes, columns: int) -> tuple[str, int]:
    lines = capture.decode("utf-8", "replace").rstrip("\n").split("\n")
    screen = pyte.Screen(columns, len(lines))
    stream = pyte.Stream(screen)
    stream.feed("\r\n".join(lines))
    rows = []
    for y in range(screen.lines):
        line = screen.buffer[y]
        spans = []
        for x in range(columns):
            char = line[x]
            fallback = f"#{char.fg}" if len(char.fg) == 6 else COLOURS["default"]
            colour = COLOURS.get(char.fg, fallback)
            weight = "bold" if char.bold else "normal"
            spans.append(
                f'<span style="color:{colour};font-weight:{weight}">{html.escape(char.data)}</span>'
            )
        rows.append("".join(spans))
    body = "\n".join(rows)
    page = (
        "<!doctype html><meta charset=utf-8><style>"
        f"body{{margin:0;background:{BACKGROUND}}}"
        "pre{margin:12px;font:14px/18px 'DejaVu Sans Mono',monospace;white-space:pre}"
        f"</style><pre>{body}</pre>"
    )
    return page, screen.lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--columns", type=int, default=80)
    args = parser.parse_args(argv)
    page, rows = to_html(args.capture.read_bytes(), args.columns)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("terminal_png: chromium not found (apt-get install -y chromium)", file=sys.stderr)
        return 1
    width = int(args.columns * CELL_W) + 24
    height = rows * CELL_H + 24
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "capture.html"
        source.write_text(page, encoding="utf-8")
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--hide-scrollbars",
                f"--window-size={width},{height}",
                f"--screenshot={args.png.resolve()}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

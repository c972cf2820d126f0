"""The live panel as a terminal shows it mid-run: examples/train.py under ``pipeprof run --live``
on a pseudo-terminal, the last whole panel read while the script still trains, written as text
and as an SVG picture of it.

    .venv/bin/python dev/live_screen.py docs/img/live.txt     # (dev/screenshot.sh runs it)
"""

import os
import pty
import re
import select
import sys
import time

ESC = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PANEL = re.compile(r"╭─ pipeprof · epoch \d+ · step \d+ · \d+ s ─*╮\r?\n(?:│.*│\r?\n)+╰─*╯")


def main(path: str) -> None:
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["COLUMNS"] = "100"
        os.execv(sys.executable, [sys.executable, "-m", "pipeprof", "run", "--live", "-o",
                                  os.devnull, "examples/train.py", "--images", "2048"])
    out, frames, t0 = b"", [], time.monotonic()
    while time.monotonic() - t0 < 300 and len(frames) < 6:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
        frames = PANEL.findall(ESC.sub("", out.decode(errors="replace")))
        frames = [f for f in frames if "samples/s" in f]
    os.kill(pid, 15)
    os.waitpid(pid, 0)
    if not frames:
        sys.exit("no live panel with figures came: is the demo too short?")
    frame = frames[-1].replace("\r", "")
    with open(path, "w") as f:
        f.write(frame + "\n")
    from rich.console import Console  # the same frame as a picture of the terminal
    from rich.text import Text

    with open(os.devnull, "w") as sink:
        console = Console(record=True, width=60, file=sink)
        console.print(Text(frame))
    svg = os.path.splitext(path)[0] + ".svg"
    console.save_svg(svg, title="pipeprof run --live")
    print(f"wrote {path} and {svg}")


if __name__ == "__main__":
    main(sys.argv[1])

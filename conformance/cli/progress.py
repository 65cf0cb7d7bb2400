"""Live campaign progress: a rich live display on a terminal, plain lines elsewhere (CI logs).

Either way the state is shown at least every `interval` seconds (a heartbeat thread for plain
output, rich's own refresh on a terminal), so a long shrink or compile is never silent: what is
being shrunk, for how long, at which size.
"""
from __future__ import annotations

import sys
import threading
import time


def status_line(c) -> str:
    el = c.elapsed()
    rate = c.checked / el if el > 0 else 0.0
    known = len(c.tracked_roots())   # (--known: the corpus roots seen; the rest of the corpus is not counted)
    msg = (f"[{el:6.1f}s/{c.opts.budget:.0f}s] programs {c.checked} ({rate:.2f}/s)  findings {len(c.new_findings())}"
           + (f", known seen {known}" if known else "") + f"  left {max(0.0, c.opts.budget - el):.0f}s")
    now = time.monotonic()
    for _ in range(3):   # another thread may change the dict while it is copied
        try:
            shrinking = sorted(c.shrinking.items())
            break
        except RuntimeError:
            shrinking = []
    for i, sh in shrinking:
        k = sh["key"]
        msg += (f"  | shrinking {k[0]}:{k[1]} {k[3] or ''} to {sh['size']} stmts (from {sh['original_size']}), "
                f"step {sh['steps']}, {now - sh['since']:.0f}s")
    return msg


class Progress:
    def __init__(self, stream=None, interval: float = 5.0, live: bool | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.interval = interval
        self.c = None
        self._last = 0.0
        self._findings = 0
        self._stop = threading.Event()
        self._thread = None
        self._rich = None

    def __call__(self, c) -> None:
        self.c = c
        if self._rich is None and self.live:
            self._start_live()
        if not self.live:
            now = time.monotonic()
            if len(c.findings) != self._findings or now - self._last >= self.interval:
                self._print()

    def _print(self) -> None:
        c = self.c
        if c is None:
            return
        self._findings = len(c.findings)
        self._last = time.monotonic()
        self.stream.write(status_line(c) + "\n")
        self.stream.flush()

    def _start_live(self) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text
        self._rich = Live(get_renderable=lambda: Text(status_line(self.c) if self.c else "starting"),
                          console=Console(file=self.stream), refresh_per_second=4, transient=False)
        self._rich.start()

    def start(self, c=None) -> "Progress":
        self.c = c or self.c
        if self.live:
            if self.c is not None:
                self._start_live()
            return self

        def beat():
            while not self._stop.wait(min(1.0, self.interval / 3)):
                if self.c is not None and time.monotonic() - self._last >= self.interval:
                    self._print()
        self._thread = threading.Thread(target=beat, daemon=True, name="progress")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        elif self.c is not None:
            self._print()

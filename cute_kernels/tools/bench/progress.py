"""Progress of a benchmark as it runs: a tqdm or rich bar when one is importable, else plain lines."""

from __future__ import annotations

import sys
import time


class Progress:
    """``with Progress(total, "gemm") as p: p.step("4096x4096x4096 cuBLAS")`` -- one step per timing.
    ``p.note(text)`` prints a line without breaking the bar."""

    def __init__(self, total: int, desc: str, plain: bool = False):
        self.total, self.desc, self.done, self.t0 = max(1, total), desc, 0, time.time()
        self._bar = self._rich = None
        if not plain:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=self.total, desc=desc, file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                try:
                    from rich.progress import Progress as RichProgress

                    self._rich = RichProgress(transient=False)
                    self._rich.start()
                    self._task = self._rich.add_task(desc, total=self.total)
                except ImportError:
                    self._rich = None

    def step(self, what: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(what[:60], refresh=False)
            self._bar.update(1)
        elif self._rich is not None:
            self._rich.update(self._task, advance=1, description=f"{self.desc} {what[:40]}")
        elif self.done == self.total or self.done % max(1, self.total // 20) == 0:
            print(f"[{self.desc}] {self.done}/{self.total} {what} ({time.time() - self.t0:.0f} s)", flush=True)

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        elif self._rich is not None:
            self._rich.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._rich is not None:
            self._rich.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

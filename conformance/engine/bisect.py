"""Bisecting a finding over a framework's releases: its short repro run in each release's environment
(conformance.engine.environments); exit 1 reproduces, 0 does not, anything else cannot run there (the repro exits
CANNOT_RUN itself where the release lacks an API it uses, or fails before the check).

Both ends of the range first, then bisection between two releases that answer differently, so the releases on
either side of every change are both run; a release that cannot run is stepped over (its neighbours are asked).
Releases before the first that has every API the repro uses are `cannot run` without building anything."""
from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from packaging.version import Version

from conformance.errors import UsageError
from conformance.ir import releases

REPRODUCES, NOT, CANNOT = "reproduces", "does not", "cannot run"
RUN_TIMEOUT = 900


@dataclass
class Answer:
    release: str
    answer: str
    exit: int | None = None
    seconds: float = 0.0
    why: str = ""          # cannot run: the repro's own line, or what stopped it


@dataclass
class Bisection:
    framework: str
    releases: list[str]                       # the range, oldest first
    answers: dict[str, Answer] = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)   # the APIs the repro uses

    def ordered(self) -> list[Answer]:
        return [self.answers[r] for r in self.releases if r in self.answers]

    def runnable(self) -> list[Answer]:
        return [a for a in self.ordered() if a.answer != CANNOT]

    @property
    def first_seen(self) -> str | None:
        return next((a.release for a in self.runnable() if a.answer == REPRODUCES), None)

    @property
    def last_good(self) -> str | None:
        """The last release that does not reproduce before the first that does (a regression's good side)."""
        run = self.runnable()
        i = next((k for k, a in enumerate(run) if a.answer == REPRODUCES), None)
        return run[i - 1].release if i else None

    @property
    def fixed_in(self) -> str | None:
        """The first release that does not reproduce after the last that does."""
        run = self.runnable()
        last = max((k for k, a in enumerate(run) if a.answer == REPRODUCES), default=None)
        return run[last + 1].release if last is not None and last + 1 < len(run) else None

    def verdict(self) -> str:
        run = self.runnable()
        if not run:
            return f"cannot run on any release tried ({self.releases[0]}..{self.releases[-1]})"
        rep = [a.release for a in run if a.answer == REPRODUCES]
        span = f"{run[0].release}..{run[-1].release}"
        if not rep:
            return f"does not reproduce in any release tried ({span})"
        if len(rep) == len(run):
            return f"reproduces in every release tried ({span})"
        parts = [f"reproduces in {rep[0]}" + (f"-{rep[-1]}" if rep[-1] != rep[0] else "")]
        if self.last_good:
            parts.append(f"not in {self.last_good}: introduced in {self.first_seen}")
        if self.fixed_in:
            parts.append(f"not in {self.fixed_in}: fixed in {self.fixed_in}")
        return "; ".join(parts)

    def record(self) -> dict:
        """What a corpus root keeps of it (`bisect --write`)."""
        return {"framework": self.framework, "range": [self.releases[0], self.releases[-1]],
                "answers": {a.release: a.answer for a in self.ordered()}, "first_seen": self.first_seen,
                "last_good": self.last_good, "fixed_in": self.fixed_in, "verdict": self.verdict(),
                "at": time.strftime("%Y-%m-%d")}

    def table(self) -> list[str]:
        w = max([len(r) for r in self.releases] + [7])
        out = [f"{'release':<{w}}  {'answer':<10}  exit  seconds  note"]
        for a in self.ordered():
            out.append(f"{a.release:<{w}}  {a.answer:<10}  {'-' if a.exit is None else a.exit:>4}  "
                       f"{a.seconds:>7.1f}  {a.why[:100]}".rstrip())
        return out

    def as_json(self) -> dict:
        return {**self.record(), "table": [asdict(a) for a in self.ordered()], "needs": self.needs}


def select(all_releases: list[str], span: str | None, framework: str) -> list[str]:
    """The releases of `A..B` (either end may be left out: `..B`, `A..`), oldest first."""
    if not span:
        return list(all_releases)
    if ".." not in span:
        raise UsageError(f"--range: give A..B (either end may be left out), got {span!r}")
    a, b = (x.strip() or None for x in span.split("..", 1))
    lo = releases.parse(a) if a else None
    hi = releases.parse(b) if b else None
    if (a and lo is None) or (b and hi is None):
        raise UsageError(f"--range: {span!r}: not release numbers")
    out = [r for r in all_releases if (lo is None or Version(r) >= lo) and (hi is None or Version(r) <= hi)]
    if not out:
        raise UsageError(f"--range {span}: no {framework} release in it (known: {all_releases[0]}..{all_releases[-1]})")
    return out


def run_script(python: str, script: Path, release: str, timeout: float = RUN_TIMEOUT) -> Answer:
    t0 = time.monotonic()
    env = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "HOME": str(Path.home()),
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        r = subprocess.run([python, str(script)], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return Answer(release, CANNOT, None, time.monotonic() - t0, f"timed out after {timeout:.0f} s")
    dt = time.monotonic() - t0
    if r.returncode == 1:
        return Answer(release, REPRODUCES, 1, dt)
    if r.returncode == 0:
        return Answer(release, NOT, 0, dt)
    lines = [x for x in (r.stdout + "\n" + r.stderr).splitlines() if x.strip()]
    why = next((x for x in lines if x.startswith("CANNOT RUN")), lines[-1] if lines else "")
    return Answer(release, CANNOT, r.returncode, dt, why.strip())


def bisect(framework: str, script_source: str, candidates: list[str], ask: Callable[[str], Answer],
           log=print, anchors: tuple[str, ...] = ()) -> Bisection:
    """Bisect a repro over `candidates` (oldest first); `ask(release)` runs it there. `anchors`: releases run
    after both ends (the one the finding was seen on): where both ends answer alike but an anchor does not (a
    behaviour that came and went), each side of it is bisected."""
    needs = releases.used_by(script_source, framework)
    first = releases.oldest_with(needs).get(framework)
    # releases before the first with every API the repro uses cannot run it: the range starts there
    runnable = [r for r in candidates if first is None or Version(r) >= first]
    if not runnable:
        b = Bisection(framework, list(candidates), needs=needs)
        for r in candidates:
            b.answers[r] = Answer(r, CANNOT, None, 0.0, releases.why(
                [n for n in needs if not releases.APIS[n].in_release(r)], {framework: r}))
        return b
    candidates = runnable
    b = Bisection(framework, list(candidates), needs=needs)

    def get(i: int) -> Answer:
        r = candidates[i]
        if r not in b.answers:
            b.answers[r] = ask(r)
            a = b.answers[r]
            log(f"  {framework} {r}: {a.answer}" + (f" ({a.why[:120]})" if a.why else ""))
        return b.answers[r]

    n = len(candidates)
    hi = next((i for i in range(n - 1, -1, -1) if get(i).answer != CANNOT), None)
    if hi is None:
        return b
    # the oldest runnable release: releases that cannot run come before those that can (an API arrives), so the
    # boundary is bisected too
    lo, bad = hi, -1
    if get(0).answer != CANNOT:
        lo = 0
    else:
        bad = 0
        while lo - bad > 1:
            m = (lo + bad) // 2
            if get(m).answer == CANNOT:
                bad = m
            else:
                lo = m

    def split(lo: int, hi: int) -> None:
        """Between two runnable releases that answer differently: the last of the one answer and the first of the
        other, both run; where the changes are several (it comes and goes), each one found is split again."""
        if hi - lo <= 1 or get(lo).answer == get(hi).answer:
            return
        mid = (lo + hi) // 2
        order = sorted(range(lo + 1, hi), key=lambda i: (abs(i - mid), i))
        m = next((i for i in order if get(i).answer != CANNOT), None)
        if m is None:
            return
        split(lo, m)
        split(m, hi)

    marks = sorted({lo, hi} | {candidates.index(a) for a in anchors if a in candidates[lo:hi + 1]})
    marks = [m for m in marks if get(m).answer != CANNOT]
    for a, z in zip(marks, marks[1:]):
        split(a, z)
    return b

"""The campaign's output directory: run.json, results.jsonl (append-only, each record flushed and
synced before it counts), findings.json and corpus/<hash>.json (written atomically), summary.md."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

RESULTS = "results.jsonl"
FINDINGS = "findings.json"
RUN = "run.json"
SUMMARY = "summary.md"
CORPUS = "corpus"


class StoreError(ValueError):
    """A problem with the output directory: the message names the path and what to do."""


def atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _sync_dir(path.parent)


def _sync_dir(d: Path) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> tuple[list[dict], str | None]:
    """Records of a JSONL file, tolerating a torn last line. Returns (records, warning)."""
    if not path.exists():
        return [], None
    data = path.read_bytes()
    lines = data.split(b"\n")
    out, warning = [], None
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            out.append(json.loads(raw))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if k == len(lines) - 1:
                warning = f"{path}: ignored a torn last line ({len(raw)} bytes)"
            else:
                raise StoreError(f"{path}: line {k + 1}: not valid JSON") from None
    return out, warning


class Store:
    def __init__(self, out: str | Path, overwrite: bool = False, resume: bool = False):
        self.dir = Path(out)
        if self.dir.exists() and not self.dir.is_dir():
            raise StoreError(f"--out {self.dir}: exists and is not a directory")
        nonempty = self.dir.exists() and any(self.dir.iterdir())
        if nonempty and not (overwrite or resume):
            raise StoreError(f"--out {self.dir}: directory is not empty (use --overwrite to replace it, "
                             f"or --resume to continue the campaign in it)")
        if nonempty and resume and not (self.dir / RUN).exists():
            raise StoreError(f"--out {self.dir}: nothing to resume (no {RUN})")
        if nonempty and overwrite and not resume:
            for name in (RESULTS, FINDINGS, RUN, SUMMARY):
                p = self.dir / name
                if p.exists():
                    p.unlink()
            c = self.dir / CORPUS
            if c.exists():
                for f in c.glob("*.json"):
                    f.unlink()
        (self.dir / CORPUS).mkdir(parents=True, exist_ok=True)
        self._results = None

    # -- run.json --------------------------------------------------------------------
    def write_run(self, obj: dict) -> None:
        atomic_write(self.dir / RUN, json.dumps(obj, indent=1, sort_keys=True))

    def read_run(self) -> dict:
        try:
            return json.loads((self.dir / RUN).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise StoreError(f"{self.dir / RUN}: cannot read: {e}") from None

    # -- results.jsonl ---------------------------------------------------------------
    def append_result(self, rec: dict) -> None:
        if self._results is None:
            path = self.dir / RESULTS
            # A torn last line (from a kill mid-write) is cut off before appending.
            if path.exists():
                data = path.read_bytes()
                if data and not data.endswith(b"\n"):
                    cut = data.rfind(b"\n") + 1
                    with open(path, "r+b") as f:
                        f.truncate(cut)
            self._results = open(path, "ab")
        line = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
        self._results.write(line)
        self._results.flush()
        os.fsync(self._results.fileno())

    def results(self) -> tuple[list[dict], str | None]:
        return read_jsonl(self.dir / RESULTS)

    # -- findings and corpus ---------------------------------------------------------
    def write_findings(self, findings: list[dict]) -> None:
        atomic_write(self.dir / FINDINGS, json.dumps(findings, indent=1, sort_keys=True))

    def read_findings(self) -> list[dict]:
        p = self.dir / FINDINGS
        if not p.exists():
            return []
        try:
            obj = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise StoreError(f"{p}: not valid JSON: {e}") from None
        if not isinstance(obj, list):
            raise StoreError(f"{p}: must be a list of findings")
        return obj

    def write_corpus(self, name: str, obj: dict) -> Path:
        p = self.dir / CORPUS / f"{name}.json"
        atomic_write(p, json.dumps(obj, indent=1, sort_keys=True))
        return p

    def corpus_files(self) -> Iterator[Path]:
        return iter(sorted((self.dir / CORPUS).glob("*.json")))

    def write_summary(self, text: str) -> None:
        atomic_write(self.dir / SUMMARY, text)

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)

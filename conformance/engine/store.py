"""The campaign's output directory: run.json, results.jsonl (append-only, each record flushed and
synced before it counts), findings.json and corpus/<check>-<pipeline>-<hash8>.json (written atomically), summary.md.

results.jsonl invariants (what --resume relies on): one JSON object per line; "result" records
carry a unique `seq` (assigned here) and a unique (hash, seed); a line torn by a kill in the
middle of a write is only ever the last one, is reported by the reader and cut off before the
next append; a complete last record that lost only its newline is kept."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conformance.engine.findings import Finding
from conformance.files import InputRefused, read_bounded, read_text

RESULTS = "results.jsonl"
FINDINGS = "findings.json"
RUN = "run.json"
SUMMARY = "summary.md"
CORPUS = "corpus"
ISSUE = ".issue.md"   # corpus/<entry>.issue.md: a finding's upstream-ready issue text


class StoreError(ValueError):
    """A problem with the output directory: the message names the path and what to do."""


@contextlib.contextmanager
def _sigint_deferred():
    """Hold back SIGINT (Ctrl-C) for the duration; deliver it afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []
    try:
        old = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    except (ValueError, TypeError):   # no signal support here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        if got:
            if callable(old):
                old(signal.SIGINT, None)
            elif old == signal.default_int_handler or old == signal.SIG_DFL:
                raise KeyboardInterrupt


def atomic_write(path: Path, text: str) -> None:
    """Write `path` through a temporary file and os.replace: a reader (or a kill) sees the old text or
    the new one, never part of it. A failed write leaves no temporary file behind."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
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


# Tests only: on the N-th append of this process, write half the record and SIGKILL ourselves.
KILL_IN_WRITE_ENV = "REMAT_CONFORMANCE_TEST_KILL_IN_WRITE"
# tests: after the Nth append, wait (up to a minute) for a Ctrl-C, so that one lands mid-campaign
PAUSE_AFTER_ENV = "REMAT_CONFORMANCE_TEST_PAUSE_AFTER"
PAUSED_MARK = ".paused"   # created in the output directory while paused


RESULTS_SCHEMA = 1   # results.jsonl's records


class ResultRecord(BaseModel):
    """A "result" line of results.jsonl: one program checked. The one model of it: the campaign's
    search and `devices` build it, the store validates it on resume, the report reads it."""
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["result"] = "result"
    schema_version: int = RESULTS_SCHEMA
    hash: str
    seed: int
    seq: int                    # 0, 1, 2... over the file: Store.append_result numbers it (-1 until then)
    round: int = 0
    slot: int | None = None     # the program's slot in its seeded round (campaigns)
    t: float = 0.0              # seconds into the run
    size: int | None = None     # statements
    status: str = ""
    features: list[str] = Field(default_factory=list)
    ran: list[str] | None = None   # the pipelines that ran on it (older runs: those with verdicts)
    verdicts: list[Annotated[list[str], Field(min_length=5, max_length=5)]] = Field(default_factory=list)
    expectations: dict[str, str] = Field(default_factory=dict)
    errors: dict[str, str] = Field(default_factory=dict)
    # "check|pipeline|reference|error_type" -> detail_digest of each fail or expected verdict
    differed: dict[str, str] = Field(default_factory=dict)
    saved: dict[str, str] = Field(default_factory=dict)   # pipeline -> residuals_digest of what it saved
    seconds: dict[str, float] = Field(default_factory=dict)   # pipeline -> the seconds it ran on the program
    known_signatures: list[str] = Field(default_factory=list)
    known_keys: list[list[Any]] = Field(default_factory=list)
    new: list[list[Any]] = Field(default_factory=list)

    def line(self) -> dict:
        """The record as it is appended (fields that do not apply left out)."""
        return self.model_dump(exclude_none=True)


class FindingRecord(BaseModel):
    """A "finding" line of results.jsonl: a shrunk finding was recorded (corpus, findings.json);
    `origin` is the (hash, seed) of the result whose failure was shrunk, `target` that failure's key (the finding's
    `key` may have another label: a residual difference's changes as it shrinks)."""
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["finding"]
    signature: str
    t: float = 0.0
    origin: list[Any] | None = None
    key: list[str] | None = None
    target: list[str] | None = None
    size: int | None = None
    original_size: int | None = None
    shrink_steps: int = 0

    @field_validator("origin")
    @classmethod
    def _origin(cls, v):
        if v is not None and not (len(v) == 2 and isinstance(v[0], str) and type(v[1]) is int):
            raise ValueError("must be [program hash, input seed]")
        return v


class RoundRecord(BaseModel):
    """A "round" line: every program slot of that seeded round was checked."""
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["round"]
    round: int = Field(ge=0)
    t: float = 0.0


_RECORDS = {"result": ResultRecord, "finding": FindingRecord, "round": RoundRecord}


def _load_json(p: Path):
    """A JSON file of the run directory, read within bounds; StoreError names the file."""
    try:
        return json.loads(read_text(p))
    except InputRefused as e:
        raise StoreError(str(e)) from None
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        raise StoreError(f"{p}: not valid JSON: {e}") from None


def check_record(rec: Any, where: str) -> dict:
    """A results.jsonl record, checked: raises StoreError naming `where` and the field."""
    if not isinstance(rec, dict):
        raise StoreError(f"{where}: a record must be a JSON object, got {type(rec).__name__}")
    t = rec.get("type")
    if not isinstance(t, str):
        raise StoreError(f"{where}: type: missing or not a string")
    model = _RECORDS.get(t)
    if model is not None:
        try:
            model.model_validate(rec)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "<record>"
            raise StoreError(f"{where}: {loc}: {err['msg']}") from None
    return rec


def read_jsonl(path: Path) -> tuple[list[dict], str | None]:
    """Records of results.jsonl, tolerating a torn last line (a kill in the middle of a write).
    Returns (records, warning); the warning says what was ignored. Any other damage raises
    StoreError naming the file, the line and the field."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return [], None
    try:
        data = read_bounded(path)
    except InputRefused as e:
        raise StoreError(str(e)) from None
    lines = data.split(b"\n")
    out, warning = [], None
    for k, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, RecursionError):   # JSON, UTF-8, or an integer of thousands of digits
            if k == len(lines) - 1:
                warning = f"{path}: ignored a torn last line ({len(raw)} bytes; a write was interrupted)"
                continue
            raise StoreError(f"{path}: line {k + 1}: not valid JSON") from None
        out.append(check_record(rec, f"{path}: line {k + 1}"))
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
        if resume and overwrite:
            raise StoreError("--overwrite and --resume contradict each other: pick one")
        if resume and not (self.dir / RUN).is_file():
            raise StoreError(f"--out {self.dir}: nothing to resume (no {RUN} there)")
        if nonempty and overwrite and not resume:
            for name in (RESULTS, FINDINGS, RUN, SUMMARY):
                p = self.dir / name
                if p.exists():
                    p.unlink()
            c = self.dir / CORPUS
            if c.exists():
                for f in c.glob("*.json"):
                    f.unlink()
        try:
            (self.dir / CORPUS).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"--out {self.dir}: cannot create: {e.strerror or e}") from None
        self._fd: int | None = None
        self._keys: set = set()
        self._next_seq = 0
        self._appends = 0
        self._kill_at = 0
        self._pause_at = 0

    # -- run.json --------------------------------------------------------------------
    def write_run(self, obj: dict) -> None:
        atomic_write(self.dir / RUN, json.dumps(obj, indent=1, sort_keys=True))

    def read_run(self) -> dict:
        p = self.dir / RUN
        obj = _load_json(p)
        if not isinstance(obj, dict) or not isinstance(obj.get("options"), dict):
            raise StoreError(f"{p}: options: run.json must be an object with an object 'options'")
        if obj.get("schema_version") != 1:
            raise StoreError(f"{p}: schema_version: {obj.get('schema_version')!r} is not readable (this harness "
                             f"reads 1)")
        return obj

    # -- results.jsonl ---------------------------------------------------------------
    def append_result(self, rec: dict) -> bool:
        """Append one record; it counts once it is written and synced. Records of type "result"
        are numbered here (`seq`: 0, 1, 2... over the whole file) and written once per
        (hash, seed): a second one is dropped and False returned. Ctrl-C is held back while the
        line is written and synced, so an interrupt never leaves half a record behind."""
        if self._fd is None:
            self._open_results()
        if rec.get("type") == "result":
            key = (rec.get("hash"), rec.get("seed"))
            if key in self._keys:
                return False
            rec["seq"] = self._next_seq
        line = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
        with _sigint_deferred():
            self._appends += 1
            if self._kill_at and self._appends == self._kill_at:   # tests: a kill mid-write
                os.write(self._fd, line[:max(1, len(line) // 2)])
                os.fsync(self._fd)
                os.kill(os.getpid(), signal.SIGKILL)
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        if rec.get("type") == "result":
            self._keys.add(key)
            self._next_seq += 1
        if self._pause_at and self._appends == self._pause_at:
            mark = self.dir / PAUSED_MARK
            mark.touch()
            try:
                time.sleep(60)
            finally:
                mark.unlink(missing_ok=True)
        return True

    def _open_results(self) -> None:
        path = self.dir / RESULTS
        if path.exists():
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                last = data[cut:]
                try:
                    complete = isinstance(json.loads(last), dict)
                except (ValueError, RecursionError):   # JSON, UTF-8, or an integer of thousands of digits
                    complete = False
                with open(path, "r+b") as f:
                    if complete:     # a whole record whose newline was not written: keep it
                        f.seek(0, os.SEEK_END)
                        f.write(b"\n")
                    else:            # a torn record (a kill mid-write): cut it off
                        f.truncate(cut)
                    f.flush()
                    os.fsync(f.fileno())
        recs, _ = read_jsonl(path)
        results = [r for r in recs if r["type"] == "result"]
        self._keys = {(r["hash"], r["seed"]) for r in results}
        self._next_seq = max((r["seq"] for r in results), default=-1) + 1
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._kill_at = int(os.environ.get(KILL_IN_WRITE_ENV, "0") or 0)
        self._pause_at = int(os.environ.get(PAUSE_AFTER_ENV, "0") or 0)

    def results(self) -> tuple[list[dict], str | None]:
        return read_jsonl(self.dir / RESULTS)

    # -- findings and corpus ---------------------------------------------------------
    def write_findings(self, findings: list[dict]) -> None:
        atomic_write(self.dir / FINDINGS, json.dumps(findings, indent=1, sort_keys=True))

    def read_findings(self) -> list[dict]:
        """The findings, each validated (a refused one names its index and field)."""
        p = self.dir / FINDINGS
        if not p.exists() and not p.is_symlink():
            return []
        obj = _load_json(p)
        if not isinstance(obj, list):
            raise StoreError(f"{p}: must be a list of findings")
        for k, f in enumerate(obj):
            try:
                Finding.model_validate(f)
            except ValidationError as e:
                err = e.errors()[0]
                raise StoreError(f"{p}: [{k}].{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
        return obj

    def write_corpus(self, name: str, obj: dict) -> Path:
        p = self.dir / CORPUS / f"{name}.json"
        atomic_write(p, json.dumps(obj, indent=1, sort_keys=True))
        return p

    def write_issue(self, name: str, text: str) -> Path:
        """The upstream-ready issue text beside corpus entry `name` (conformance/reporting/issue_text.py)."""
        return write_issue_text(self.dir, name, text)

    def corpus_files(self) -> Iterator[Path]:
        return iter(sorted((self.dir / CORPUS).glob("*.json")))

    def write_summary(self, text: str) -> None:
        atomic_write(self.dir / SUMMARY, text)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def issue_path(run_dir: str | Path, name: str) -> Path:
    """The issue text of corpus entry `name` (its file name without .json) of run directory `run_dir`."""
    return Path(run_dir) / CORPUS / f"{name}{ISSUE}"


def write_issue_text(run_dir: str | Path, name: str, text: str) -> Path:
    """Write (or rewrite) an issue text atomically: a kill leaves the old text or the new one, never a
    torn file (the campaign's first write, its final refresh and `report`'s refresh alike)."""
    p = issue_path(run_dir, name)
    atomic_write(p, text)
    return p


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True)

"""Report inputs: run directories (run.json, results.jsonl, findings.json) and baseline reports.

Any problem with an input is a ReportInputError naming the file, the field and the reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conformance.engine.findings import Finding, observations_problem
from conformance.engine.options import RecordedOptions
from conformance.engine.store import ResultRecord, StoreError, read_jsonl
from conformance.engine.tally import Tally
from conformance.errors import field_path
from conformance.files import InputRefused, read_text
from conformance.ir.nodes import ProgramError
from conformance.ir.program import load_program

REPORT_SCHEMA_VERSION = 1
# Input schema versions this harness reads (run.json, results.jsonl records, findings.json entries).
READS_SCHEMA = 1


class ReportInputError(ValueError):
    """An input the report cannot use. `file` is the path, `field` the JSON path in it."""

    def __init__(self, file: str, field: str, reason: str):
        super().__init__(f"{file}: {field}: {reason}")
        self.file, self.field, self.reason = file, field, reason


# ---- input schemas ------------------------------------------------------------------------------
class RunInfo(BaseModel):
    """run.json as the report reads it."""
    model_config = ConfigDict(extra="allow")
    schema_version: int
    harness: str = "?"
    options: RecordedOptions = Field(default_factory=RecordedOptions)   # the one Options model
    versions: dict[str, str] = Field(default_factory=dict)
    started: str | None = None


_loc = field_path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except InputRefused as e:
        raise ReportInputError(str(path), "<file>", str(e).removeprefix(f"{path}: ")) from None
    except json.JSONDecodeError as e:
        raise ReportInputError(str(path), f"line {e.lineno} column {e.colno}", f"not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ReportInputError(str(path), "<root>", "nesting too deep") from None
    except ValueError as e:   # an integer of thousands of digits
        raise ReportInputError(str(path), "<file>", str(e)) from None


def _exists(p: Path) -> bool:
    """There is something at p (a dangling or looping link counts: reading it says what is wrong)."""
    return p.exists() or p.is_symlink()


def _check_observations(f, path: Path, where: str) -> None:
    bad = observations_problem(f.detail)
    if bad is not None:
        raise ReportInputError(str(path), f"{where}.detail.observations{bad[0]}", bad[1])


def _check_version(path: Path, where: str, sv) -> None:
    if sv != READS_SCHEMA:
        raise ReportInputError(str(path), where, f"schema_version {sv!r} is not readable by this harness "
                                                 f"(it reads schema_version {READS_SCHEMA}); rebuild the report "
                                                 f"with the harness version that wrote this directory")


@dataclass
class RunData:
    dir: Path
    info: RunInfo | None
    results: list[ResultRecord] = field(default_factory=list)
    findings: list = field(default_factory=list)          # conformance.engine.findings.Finding
    warnings: list[str] = field(default_factory=list)
    report: dict | None = None   # a previous report.json (baselines only)
    cell: str = ""
    tally: Tally | None = None   # the results already counted (a campaign's own summary); else from results

    @property
    def label(self) -> str:
        if self.info and self.info.started:
            return f"{self.dir.name} ({self.info.started[:16]})"
        if self.report:
            return f"{self.dir.name} ({str(self.report.get('generated', ''))[:16]})"
        return self.dir.name


def load_run(d: str | Path, allow_report: bool = False) -> RunData:
    """Read and validate one run directory (or, for baselines, a report directory)."""
    d = Path(d)
    if not d.is_dir():
        raise ReportInputError(str(d), "<dir>", "not a directory")
    runp, resp, findp, repp = d / "run.json", d / "results.jsonl", d / "findings.json", d / "report.json"
    if allow_report and not _exists(runp) and _exists(repp):
        obj = _read_json(repp)
        if not isinstance(obj, dict):
            raise ReportInputError(str(repp), "<root>", "must be a JSON object")
        if obj.get("schema_version") != REPORT_SCHEMA_VERSION:
            raise ReportInputError(
                str(repp),
                "schema_version",
                f"{obj.get('schema_version')!r} is not readable "
                f"(this harness reads report schema {REPORT_SCHEMA_VERSION})",
            )
        rd = RunData(d, None, report=obj)
        if not isinstance(obj.get("findings", []), list):
            raise ReportInputError(str(repp), "findings", "must be a list")
        for k, f in enumerate(obj.get("findings") or []):
            try:
                rd.findings.append(Finding.model_validate(f.get("finding") if isinstance(f, dict) else f))
            except (ValidationError, AttributeError) as e:
                raise ReportInputError(str(repp), f"findings[{k}].finding", _why(e)) from None
            _check_observations(rd.findings[-1], repp, f"findings[{k}].finding")
        return rd
    if not _exists(runp):
        raise ReportInputError(str(d), "run.json", "missing: not a campaign output directory "
                                                   "(expected run.json, results.jsonl, findings.json)")
    obj = _read_json(runp)
    if not isinstance(obj, dict):
        raise ReportInputError(str(runp), "<root>", "must be a JSON object")
    _check_version(runp, "schema_version", obj.get("schema_version"))
    try:
        info = RunInfo.model_validate(obj)
    except ValidationError as e:
        raise ReportInputError(str(runp), _loc(e.errors()[0]), e.errors()[0]["msg"]) from None
    rd = RunData(d, info)
    try:
        records, warn = read_jsonl(resp)
    except StoreError as e:   # its message names the file, the line and the field
        msg = str(e).removeprefix(f"{resp}: ")
        where, _, why = msg.partition(": ")
        raise ReportInputError(str(resp), where if why else "<file>", why or msg) from None
    except RecursionError:
        raise ReportInputError(str(resp), "<file>", "nesting too deep") from None
    if warn:
        rd.warnings.append(warn)
    for k, r in enumerate(records):
        if not isinstance(r, dict):
            raise ReportInputError(str(resp), f"record {k + 1}", "must be a JSON object")
        if r.get("type") == "result":
            _check_version(resp, f"record {k + 1}.schema_version", r.get("schema_version"))
        if r.get("type") != "result":
            continue
        try:   # (the store checked it already: the same model)
            rd.results.append(ResultRecord.model_validate(r))
        except ValidationError as e:
            raise ReportInputError(str(resp), f"record {k + 1}.{_loc(e.errors()[0])}", e.errors()[0]["msg"]) from None
    if _exists(findp):
        fl = _read_json(findp)
        if not isinstance(fl, list):
            raise ReportInputError(str(findp), "<root>", "must be a list of findings")
        for k, f in enumerate(fl):
            if isinstance(f, dict):
                _check_version(findp, f"[{k}].schema_version", f.get("schema_version", READS_SCHEMA))
            try:
                fd = Finding.model_validate(f)
            except ValidationError as e:
                raise ReportInputError(str(findp), f"[{k}].{_loc(e.errors()[0])}", e.errors()[0]["msg"]) from None
            try:
                load_program(fd.program)
            except ProgramError as e:
                raise ReportInputError(str(findp), f"[{k}].program.{e.field}", e.reason) from None
            except RecursionError:
                raise ReportInputError(str(findp), f"[{k}].program", "nesting too deep") from None
            _check_observations(fd, findp, f"[{k}]")
            rd.findings.append(fd)
    else:
        rd.warnings.append(f"{findp}: missing (no findings recorded)")
    return rd


def _why(e) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{_loc(err)}: {err['msg']}"
    return str(e)

"""The regression corpus's programs by the names of the entries they were (tests that need one
program): `variant_path("b324b466757472b7")` writes that variant of its root as a plain corpus
entry (a campaign's shape) into a temporary folder and returns the file."""
from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

REG = Path(__file__).parent / "regressions"
_OUT = Path(tempfile.mkdtemp(prefix="corpus-variants-"))
atexit.register(shutil.rmtree, _OUT, ignore_errors=True)


def root_files() -> list[Path]:
    return [p for p in sorted(REG.glob("*.json")) if p.name != "status.json"]


def variants() -> dict[str, tuple[Path, dict]]:
    """name -> (its root file, the variant as a plain corpus entry)."""
    out = {}
    for p in root_files():
        obj = json.loads(p.read_text())
        for v in obj.get("variants", [{**obj, "name": p.stem}]):
            out[v["name"]] = (p, {k: x for k, x in v.items() if k != "name"})
    return out


def variant_obj(name: str) -> dict:
    return variants()[name.removesuffix(".json")][1]


def root_of(name: str) -> Path:
    return variants()[name.removesuffix(".json")][0]


def variant_path(name: str) -> Path:
    stem = name.removesuffix(".json")
    out = _OUT / f"{stem}.json"
    if not out.exists():
        out.write_text(json.dumps(variant_obj(stem)))
    return out

"""README's feature vocabulary table, generated from the declarations (conformance.ir.features
FEATURES, with the op table's features: name, meaning, campaign focus): prints it, or with --write
replaces README's table.
tests/test_ir.py holds README to it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
README = ROOT / "README.md"
HEAD = "| feature | meaning | campaign focus (swarm dimensions) |\n|---|---|---|\n"
SECTION = re.compile(r"(### Feature vocabulary\n\n)(\| feature \| meaning \|.*\n\|---\|---\|.*\n(?:\|.*\|\n)+)")


def table() -> str:
    from conformance.ir.features import FEATURES
    from conformance.ir.ops import FEATURES as OP_FEATURES
    from generators.swarm import FOCUS  # (FEATURES' focus, and the policy kinds')
    rows = {**FEATURES, **{k: v for k, v in OP_FEATURES.items() if k not in FEATURES}}
    def focus(k):   # (a policy kind is aimed at with its own dimension on)
        dims = ("checkpoint", "policy:<kind>") if k == "policy:<kind>" else FOCUS.get(k, ())
        return ", ".join(f"`{d}`" for d in dims) or "-"
    return HEAD + "".join(f"| `{k}` | {f.doc} | {focus(k)} |\n" for k, f in rows.items())


def readme_table(text: str) -> str:
    m = SECTION.search(text)
    if m is None:
        raise SystemExit(f"{README}: no '### Feature vocabulary' table")
    return m.group(2)


def main() -> int:
    if "--write" in sys.argv[1:]:
        text = README.read_text()
        README.write_text(SECTION.sub(lambda m: m.group(1) + table(), text, count=1))
        return 0
    print(table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

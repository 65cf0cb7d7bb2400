"""Regression-corpus roots: one file per root behaviour, made from corpus entries.

    .venv/bin/python tools/corpus_root.py make SLUG --title "..." --class bug|documented|question|harness \
        --reason "..." [--link URL]... [--reference-why "..."] ENTRY.json... [--dir tests/regressions] [--remove]
    .venv/bin/python tools/corpus_root.py regroup PLAN.json [--dir tests/regressions] [--remove]

`make` writes DIR/SLUG.json: the root's title, class (confirmed: a person chose it), reason and
links, the entries it replaces (their file names) and each entry's program as a variant, the first
named the representative. An entry that is itself a root adds its variants. `--remove` deletes the
entries it replaced. `regroup` does the same for every root of a plan: a JSON list of
{"slug", "title", "class", "reason", "links", "entries": [...], "reference_why"?}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_root(slug: str, title: str, cls: str, reason: str, links: list[str], entries: list[Path],
              reference_why: str = "") -> dict:
    from conformance.engine.findings import CorpusRoot, CorpusVariant
    from conformance.ir.verdict import Triage
    variants, replaces = [], []
    for p in entries:
        obj = json.loads(p.read_text())
        if "variants" in obj:   # a root already: its variants, and what it replaced
            variants += obj["variants"]
            replaces += obj.get("replaces", [])
        else:
            variants.append({"name": p.stem, **obj})
            replaces.append(p.name)
    root = CorpusRoot(root=slug, title=title, triage=Triage(class_=cls, reason=reason, links=links, confirmed=True),
                      reference_why=reference_why, replaces=replaces,
                      variants=[CorpusVariant.model_validate(v) for v in variants])
    return root.model_dump(mode="json", exclude_defaults=False)


def write_root(directory: Path, slug: str, obj: dict, entries: list[Path], remove: bool) -> Path:
    from conformance.engine.loading import load_corpus_variants
    out = directory / f"{slug}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    load_corpus_variants(str(tmp))   # refuse to write a root the harness cannot read
    tmp.replace(out)
    if remove:
        for p in entries:
            if p.resolve() != out.resolve():
                p.unlink()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make")
    mk.add_argument("slug")
    mk.add_argument("entries", nargs="+", type=Path)
    mk.add_argument("--title", required=True)
    mk.add_argument("--class", dest="cls", required=True, choices=("bug", "documented", "question", "harness"))
    mk.add_argument("--reason", required=True)
    mk.add_argument("--link", action="append", default=[])
    mk.add_argument("--reference-why", default="")
    rg = sub.add_parser("regroup")
    rg.add_argument("plan", type=Path)
    for p in (mk, rg):
        p.add_argument("--dir", type=Path, default=Path("tests/regressions"))
        p.add_argument("--remove", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "make":
        obj = make_root(a.slug, a.title, a.cls, a.reason, a.link, a.entries, a.reference_why)
        print(write_root(a.dir, a.slug, obj, a.entries, a.remove))
        return 0
    plan = json.loads(a.plan.read_text())
    for r in plan:
        entries = [a.dir / e for e in r["entries"]]
        obj = make_root(r["slug"], r["title"], r["class"], r["reason"], r.get("links", []), entries,
                        r.get("reference_why", ""))
        print(write_root(a.dir, r["slug"], obj, entries, a.remove), f"({len(obj['variants'])} variants)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

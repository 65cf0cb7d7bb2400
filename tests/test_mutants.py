"""Every oracle can fail: each mutant pipeline is caught by its oracle within a bounded
number of programs, and its finding is shrunk to a small program."""
from pathlib import Path

import pytest

from conformance.engine.campaign import Campaign
from conformance.engine.loading import corpus_entry_stem, load_known
from conformance.engine.options import Options
from conformance.engine.roots import family_key, labels_seen
from conformance.engine.runner import InProcessExecutor
from conformance.engine.store import Store
from conformance.pipelines.registry import run_set
from conformance.reporting.issue_text import issue_text_or_reason
from generators.programs import Config
from generators.swarm import COMPOSITIONS
from oracles.expectations import Entry, Expectations
from tests.mutants import ALSO_FAILS, COMMON_EXPECTATIONS, DETAIL, ERROR_TYPE, EXPECTATIONS, GENERATOR, MUTANTS

MAX_PROGRAMS = 150
REGRESSIONS = Path(__file__).parent / "regressions"
# Shrinking is bounded by steps only (never by seconds) so that the result is deterministic, at the campaign's own
# default number of Hypothesis steps: what a user's campaign does (the reductions make findings small; every
# mutant's finding is within these sizes with it, where 500 steps took about 4x the time).
MAX_SHRUNK_SIZE = {"residuals": 6, "gradient": 2, "error": 5, "custom_rule": 5, "residual_report": 2, "trace_count": 4}
# A mutant whose behaviour needs a program shape of its own (a custom_vjp block with its rules).
MAX_SHRUNK_SIZE_OF = {"jax:mutant-silent-wrong-where-it-must-raise": 6}


def _of_mutant(f, mutant: str, check: str, reference: str) -> bool:
    """The mutant's finding: its pipeline and check, against that reference or one of its root's
    family (a wrong gradient is one root whichever reference shows it first)."""
    return (
        f.pipeline == mutant
        and f.check == check
        and (
            f.reference == reference
            or family_key(check, mutant, reference) == family_key(f.check, f.pipeline, f.reference)
        )
    )


# The slow tier (make test-slow, nightly): a second mutant of a check whose first one runs in every `make test`
# (residuals: drop-named-residual and, against the policy, ignore-policy; gradient: perturb-gradient; error:
# raise-on-matmul and swallow-error; custom_rule: misreport-fwd-ran; residual_report and trace_count: theirs).
SLOW = {"jax:mutant-drop-iteration-residual", "jax:mutant-silent-wrong-where-it-must-raise", "jax:mutant-perturb-hvp",
        "jax:mutant-wrong-error-where-it-must-raise", "jax:mutant-wrong-message-where-it-must-raise",
        "jax:mutant-misreport-custom-rule", "jax:mutant-misreport-symbolic-zeros"}


@pytest.mark.parametrize("mutant", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
                                    for m in sorted(MUTANTS)])
def test_mutant_is_detected_and_shrunk(mutant, tmp_path):
    _, check, reference = MUTANTS[mutant]
    names = run_set([mutant])
    if reference == "policy":
        # judged against the policy alone: without jax:remat2 the residual comparison
        # cannot claim the finding first
        names.remove("jax:remat2")
    # (the composition round's dimensions left out: these mutants, their budgets and shrink sizes predate them)
    opts = Options(pipelines=names, budget=3600, max_examples=MAX_PROGRAMS, seed=3,
                   shrink_seconds=3600, generator=Config(max_stmts=4, exclude=COMPOSITIONS,
                                                                              **GENERATOR.get(mutant, {})),
                   stop_when=lambda fs: any(_of_mutant(f, mutant, check, reference) for f in fs))
    exp = Expectations.load()
    extra = COMMON_EXPECTATIONS + EXPECTATIONS.get(mutant, [])
    exp = Expectations(exp.entries + [Entry.model_validate(e) for e in extra], exp.source)
    camp = Campaign(opts, Store(tmp_path / "out"), InProcessExecutor(), exp, issue_text=issue_text_or_reason)
    camp.track(load_known([str(REGRESSIONS)]))   # real framework behaviours the corpus tracks are not new
    camp.run()
    mine = [f for f in camp.findings if _of_mutant(f, mutant, check, reference)]
    assert mine, f"{mutant} not detected in {camp.checked} programs; findings: {[f.signature for f in camp.findings]}"
    f = min(mine, key=lambda f: f.size)
    assert f.shrunk
    assert (ERROR_TYPE[mutant] or "-") in labels_seen(f) | {k[3] or "-" for k in f.reproduces if k[2] == reference}, \
        (f.error_type, f.detail)
    for path, want in DETAIL.get(mutant, {}).items():
        got = f.detail
        for part in path.split("."):
            got = got[part]
        assert got == want, (path, got, f.detail)
    for check2, ref2, et2 in ALSO_FAILS.get(mutant, []):
        assert [check2, mutant, ref2, et2] in f.reproduces, f.reproduces
    assert f.size <= MAX_SHRUNK_SIZE_OF.get(mutant, MAX_SHRUNK_SIZE[check]), (f.size, f.program)
    assert f.size <= f.original_size
    # beside its corpus entry, the finding's upstream-ready issue text (a suggested bug or question),
    # with its short repro inline or the reason there is none (a mutant is no framework's behaviour)
    texts = [
        p.read_text()
        for g in mine
        for p in [tmp_path / "out" / "corpus" / f"{corpus_entry_stem(g.check, g.pipeline, g.program_hash)}.issue.md"]
        if p.exists()
    ]
    # (its first line names the pipeline; a residual difference's names its cause: "# P recomputes a dot's output ...")
    assert texts and all(t.startswith((f"# {mutant}:", f"# {mutant} ")) and "\nExpected" in t and "\nActual: " in t
                         and ("```python\n" in t or "\nNo short repro inline: " in t) and len(t.splitlines()) < 80
                         for t in texts), texts[:1]
    # the references themselves are not blamed for the mutant's behaviour
    assert not [g for g in camp.new_findings() if g.pipeline in names and g.pipeline != mutant and g.check == check
                and g.reference not in ("policy",)]

"""Generation depends on the seed alone: not on which modules the process has imported."""
import importlib
import sys

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from generators.programs import Config, cases


def _generate(n=40):
    out = []

    @hseed(12345)
    @settings(max_examples=n, database=None, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(Config(max_stmts=5)))
    def collect(case):
        out.append((case[0].content_hash(), case[1]))
    collect()
    return out


def test_generated_programs_do_not_depend_on_the_modules_imported_before(tmp_path, monkeypatch):
    """Hypothesis draws 'local constants' from every project module a process has imported
    (hypothesis.internal.conjecture.providers), so a campaign's programs for one seed depended on
    what the process ran before (the mutant tests passed alone and failed after other tests in
    one pytest worker). The generator turns that off."""
    before = _generate()
    src = "\n".join(f"C{k} = {k * 7919 + 3}\nF{k} = {k / 7.0 + 0.123}\nS{k} = 'sx{k}'" for k in range(300))
    (tmp_path / "rc_fresh_constants.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("rc_fresh_constants")
    try:
        assert _generate() == before
    finally:
        sys.modules.pop("rc_fresh_constants", None)

"""The `pml` wheel in a fresh environment (scripts/test-wheel.sh builds and installs it): the
commands it installs and the module answer the example prompt alike, with the same account;
streaming, the modes, compiling, and errors as `pml.PmlError` with the diagnostic's code and span.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pml

REPO = Path(__file__).resolve().parents[3]
PROMPT = REPO / "schemas/docqa/prompt-composer.pml"
SCHEMA = REPO / "schemas/docqa/docqa.pml"
ANSWER = "The band is Marilyn Manson."
BIN = Path(sys.executable).parent
# `model qwen2.5-0.5b | mode reuse | TTFT 235 ms (load 22 ms, splice 3 ms, compute 209 ms) |
# tokens reused 845 / recomputed 0 / new 30 | generated 6 | decode 28.7 ms/token | finish eos`
SUMMARY = re.compile(
    r"^model (?P<model>\S+) \| mode (?P<mode>.+?) \| TTFT [\d.]+ ms \(.*\) \| "
    r"tokens reused (?P<reused>\d+) / recomputed (?P<recomputed>\d+) / new (?P<new>\d+) \| "
    r"generated (?P<generated>\d+) \| .* \| finish (?P<finish>\S+)$"
)


def account(summary):
    match = SUMMARY.match(summary)
    assert match, summary
    fields = match.groupdict()
    return fields


@pytest.fixture(scope="module")
def runtime():
    return pml.Runtime()


def test_the_command_and_the_module_answer_alike(runtime):
    shell = subprocess.run(
        [str(BIN / "pml"), "run", str(PROMPT)], capture_output=True, text=True, check=True
    )
    assert shell.stdout.strip() == ANSWER
    shell_summary = shell.stderr.strip().splitlines()[-1]
    result = runtime.run(PROMPT)
    assert result.answer == ANSWER
    assert account(result.summary) == account(shell_summary)
    assert result.ttft_ms > 0 and result.tokens_reused > 0 and result.tokens_recomputed == 0
    report = json.loads(result.json)
    assert report["answer"] == ANSWER and report["model"] == runtime.model_id


def test_tokens_stream_to_the_callback(runtime):
    pieces = []
    result = runtime.run(PROMPT, on_token=pieces.append, max_tokens=16)
    assert len(pieces) > 1
    assert "".join(pieces) == result.answer


def test_each_mode_reports_where_its_tokens_came_from(runtime):
    blend = runtime.run(PROMPT, mode="blend", max_tokens=8)
    assert blend.tokens_recomputed > 0 and blend.estimated_fidelity is not None
    full = runtime.run(PROMPT, mode="full", max_tokens=8)
    assert full.tokens_reused == 0 and full.tokens_new == int(account(full.summary)["new"]) > 0
    assert account(blend.summary)["mode"].startswith("blend")


def test_what_pml_run_prints_on_the_way_comes_back_as_notices(runtime, capfd):
    plain = runtime.run(PROMPT, max_tokens=4)
    assert plain.notices == []
    shown = runtime.run(PROMPT, max_tokens=4, options=["--show-plan"])
    # The plan `pml run --show-plan` prints: one notice, naming the spliced modules.
    assert len(shown.notices) == 1, shown.notices
    assert shown.notices[0].startswith("plan: schema `docqa`") and "tyler-bates" in shown.notices[0]
    # Nothing reaches the host program's stderr.
    assert capfd.readouterr().err == ""


def test_compile_reports_the_schema(runtime):
    summary = runtime.compile(SCHEMA)
    assert "compiled `docqa`" in summary and runtime.model_id in summary


def test_errors_carry_the_diagnostics_code_and_span(runtime, tmp_path):
    broken = tmp_path / "broken.pml"
    text = '<prompt schema="docqa"><no-such-module/><user>Which band?</user></prompt>'
    broken.write_text(text)
    with pytest.raises(pml.PmlError) as caught:
        runtime.run(broken, schema=SCHEMA)
    error = caught.value
    assert error.code == "PML205", error
    start, end = error.span
    assert "no-such-module" in text[start:end]
    assert (error.line, error.file) == (1, str(broken))
    assert error.diagnostics[0]["code"] == "PML205"
    with pytest.raises(pml.PmlError, match="mode"):
        runtime.run(PROMPT, mode="sideways")
    with pytest.raises(pml.PmlError) as unreadable:
        runtime.run(tmp_path / "missing.pml")
    assert unreadable.value.code is None


def test_pmlc_is_installed_too():
    checked = subprocess.run(
        [str(BIN / "pmlc"), "check", str(SCHEMA)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr


def test_a_draft_model_drafts_and_the_answer_is_the_same(runtime):
    # The default model drafting for itself: the same vocabulary, every draft its own token.
    drafted = pml.Runtime(draft_model=runtime.model_id)
    assert drafted.draft_model_id == runtime.model_id
    assert "(the draft model)" in drafted.compile(SCHEMA)
    plain = runtime.run(PROMPT, options=["--speculative", "off"])
    result = drafted.run(PROMPT)
    assert result.answer == plain.answer == ANSWER
    report = json.loads(result.json)
    assert report["tokens_drafted"] == result.tokens_drafted
    assert result.tokens_accepted <= result.tokens_drafted

"""Every code snippet of README.md and docs/*.md runs as written, and every sample output
in a console block is what the command prints now (timings masked). ``docs/regen.py``
rewrites the outputs; a block that cannot run here carries its reason in the doc."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("doc_regen", ROOT / "docs" / "regen.py")
regen = importlib.util.module_from_spec(_spec)
sys.modules["doc_regen"] = regen  # its dataclasses look their module up
_spec.loader.exec_module(regen)

DOCS = [p for p in regen.doc_files() if regen.snippets(p)]


def test_the_docs_have_snippets_and_every_skip_says_why():
    names = {p.name for p in DOCS}
    assert {"README.md", "cli.md"} <= names
    every = [s for p in DOCS for s in regen.snippets(p)]
    assert sum(s.lang == "python" and not s.skip for s in every) >= 3
    assert sum(s.lang == "console" and not s.skip for s in every) >= 3
    for s in every:
        assert s.skip is None or len(s.skip) > 10, f"{s.where}: skipped without a reason"
        assert s.lang != "bash" or s.skip, f"{s.where}: bash blocks install things: skip them"


def test_console_blocks_parse_commands_and_outputs(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n\n<!-- doc-test: skip (needs a GPU that CI lacks) -->\n```console\n"
                   "$ fusion-tvm hw list\nout\n```\n\n```console\n$ fusion-tvm a \\\n    b\n"
                   "one\ntwo\n$ fusion-tvm c\n```\n")
    first, second = regen.snippets(doc)
    assert first.skip == "needs a GPU that CI lacks" and second.skip is None
    cmds = regen.commands(second)
    assert [c.argv for c in cmds] == [["fusion-tvm", "a", "b"], ["fusion-tvm", "c"]]
    assert cmds[0].expected == ["one", "two"] and cmds[1].expected == []
    assert regen.masked(["[fusion-tvm] importing m.onnx ... 0.1 s", "rule 9.9"]) == \
        ["[fusion-tvm] importing m.onnx ... # s", "rule 9.9"]


def test_a_stale_output_is_reported_and_rewritten(tmp_path):
    doc = tmp_path / "stale.md"
    doc.write_text("```console\n$ python -c \"print('fresh')\"\nstale\n```\n")
    with regen.workspace() as cwd:
        problems = regen.check_file(doc, cwd, rewrite=True)
        assert len(problems) == 1 and "output differs" in problems[0]
        assert "stale" not in doc.read_text() and "\nfresh\n" in doc.read_text()
        assert regen.check_file(doc, cwd) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_snippets_run_and_outputs_are_current(doc, capsys):
    with regen.workspace() as cwd:
        problems = regen.check_file(doc, cwd)
    assert not problems, "\n".join(problems)

"""Every code snippet of README.md and docs/*.md, run as written; sample outputs regenerated.

    python docs/regen.py            # run the snippets, rewrite each console block's output
    python docs/regen.py --check    # run them, exit 1 where a doc differs from what it prints
    python docs/regen.py --report-png   # docs/report.png: the report, 1400x1000, in Chromium

Snippets are fenced blocks with a language: ``python`` blocks of one file run in order in
one namespace (a session: the second block may use the first one's ``cm``); ``console``
blocks are ``$ fusion-tvm ...`` commands followed by what they print (stderr and stdout as a
terminal shows them), compared after masking timings (see :data:`VOLATILE`). A block that
cannot run here says why on the line before its fence, and is left alone:

    <!-- doc-test: skip (installs packages and runs the benchmarks) -->

Everything runs in a scratch folder holding ``fusion_tvm`` (a link to this checkout's
package, so ``fusion_tvm/examples/detection_head.onnx`` resolves as in the docs) and a
corrupt ``garbage.onnx``; written files (``plan.html``, ``model.so``) land there.
``tests/test_docs.py`` runs the same checks in the default test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"<!--\s*doc-test:\s*skip\s*\((?P<why>.+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
#: Lines whose numbers are wall-clock times: compared with the numbers masked.
VOLATILE = re.compile(r"^(\[fusion-tvm\] |search time: |note: pass time )")
NUMBER = re.compile(r"\d+(\.\d+)?")
#: Languages that are snippets; a fence without a language is a drawing.
RUNNABLE = ("python", "console", "bash")


@dataclass
class Snippet:
    """One fenced block: where it is, its language and text, and why it is skipped."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: list[str]
    skip: str | None = None
    start: int = 0  # index of the first body line in the file's lines
    end: int = 0  # index of the closing fence

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"


@dataclass
class Command:
    """A ``$ command`` of a console block and the output the doc shows for it."""

    argv: list[str]
    lines: list[str]  # the command as written, continuation lines included
    expected: list[str] = field(default_factory=list)


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def snippets(path: Path) -> list[Snippet]:
    """The fenced blocks of ``path`` with a runnable language, in order."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        lang = m.group("lang")
        if lang in RUNNABLE:
            prev = next((ln for ln in reversed(lines[:i]) if ln.strip()), "")
            skip = SKIP.search(prev)
            found.append(Snippet(path, i + 1, lang, lines[i + 1:j],
                                 skip.group("why") if skip else None, i + 1, j))
        i = j + 1
    return found


def commands(snippet: Snippet) -> list[Command]:
    """A console block's commands with their shown output."""
    out: list[Command] = []
    lines = iter(snippet.body)
    for line in lines:
        if line.startswith("$ "):
            written, text = [line], line
            while text.endswith("\\"):
                written.append(next(lines))
                text = text[:-1].rstrip() + " " + written[-1].strip()
            out.append(Command(shlex.split(text[2:]), written))
        elif out:
            out[-1].expected.append(line)
        else:
            raise ValueError(f"{snippet.where}: console output before any '$ ' command")
    return out


@contextlib.contextmanager
def workspace():
    """A scratch folder laid out as the docs assume (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="fusion_tvm_docs_") as tmp:
        d = Path(tmp)
        (d / "fusion_tvm").symlink_to(ROOT / "fusion_tvm")
        (d / "garbage.onnx").write_bytes(b"\x08\x07garbage, not a protobuf \xff\xfe" * 20)
        yield d


def run_command(cmd: Command, cwd: Path) -> list[str]:
    """What the command prints, stderr and stdout in the order a terminal shows them."""
    argv = cmd.argv
    if argv[0] == "fusion-tvm":
        argv = [sys.executable, "-m", "fusion_tvm", *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TVM_NUM_THREADS="1")
    res = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=600)
    return res.stdout.rstrip("\n").splitlines()


def masked(lines: list[str]) -> list[str]:
    """Lines with the numbers of timing lines replaced by ``#``."""
    return [NUMBER.sub("#", ln) if VOLATILE.match(ln) else ln.rstrip() for ln in lines]


def run_console(snippet: Snippet, cwd: Path) -> list[str]:
    """The block as it should read: each command as written, then what it printed now."""
    body = []
    for cmd in commands(snippet):
        body.extend(cmd.lines)
        body.extend(run_command(cmd, cwd))
    return body


def run_python(snippet: Snippet, namespace: dict, cwd: Path) -> None:
    """Execute a python block in the doc's shared namespace, from the scratch folder."""
    code = compile("\n".join(snippet.body) + "\n", snippet.where, "exec")
    old = Path.cwd()
    os.chdir(cwd)
    try:
        exec(code, namespace)  # noqa: S102 - the docs' own snippets
    finally:
        os.chdir(old)


def check_file(path: Path, cwd: Path, rewrite: bool = False,
               log=lambda m: None) -> list[str]:
    """Run every snippet of ``path``; the differences found (rewritten when ``rewrite``)."""
    problems, namespace, new_bodies = [], {"__name__": "__doc_snippet__"}, []
    for snip in snippets(path):
        if snip.skip:
            log(f"{snip.where}: skipped ({snip.skip})")
            continue
        if snip.lang == "bash":
            problems.append(f"{snip.where}: a bash block must be skipped with a reason")
            continue
        log(f"{snip.where}: {snip.lang}")
        if snip.lang == "python":
            run_python(snip, namespace, cwd)
            continue
        actual = run_console(snip, cwd)
        if masked(actual) != masked(snip.body):
            problems.append(f"{snip.where}: output differs from what the commands print "
                            f"(python docs/regen.py rewrites it):\n" + _diff(snip.body, actual))
            new_bodies.append((snip, actual))
    if rewrite and new_bodies:
        lines = path.read_text().splitlines()
        for snip, actual in sorted(new_bodies, key=lambda p: -p[0].start):
            lines[snip.start:snip.end] = actual
        path.write_text("\n".join(lines) + "\n")
    return problems


def _diff(expected: list[str], actual: list[str]) -> str:
    import difflib

    return "\n".join(difflib.unified_diff(masked(expected), masked(actual), "doc", "now",
                                          lineterm="", n=1))


#: The report README.md shows: docs/cli.md's first command, in a 1400x1000 viewport.
REPORT_COMMAND = ["plan", "fusion_tvm/examples/detection_head.onnx", "--hw", "ci-x86-avx2",
                  "-q", "--html"]


def render_report_png(out: Path = ROOT / "docs" / "report.png") -> Path:
    """Write ``fusion-tvm plan ... --html`` of the bundled example and screenshot it in
    headless Chromium (``fusion_tvm.testing.browser``) at 1400x1000."""
    from fusion_tvm.testing.browser import Chromium

    with workspace() as cwd:
        page = cwd / "plan.html"
        env = dict(os.environ, PYTHONPATH=str(ROOT), TVM_NUM_THREADS="1")
        subprocess.run([sys.executable, "-m", "fusion_tvm", *REPORT_COMMAND, str(page)],
                       cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
        with Chromium() as browser:
            out.write_bytes(browser.open(page, 1400, 1000, scrollbars=False).screenshot())
    return out


def main(argv: list[str] | None = None) -> int:
    """Regenerate (default) or check (``--check``) every doc; 1 when a check fails."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare only, write nothing")
    p.add_argument("--report-png", action="store_true",
                   help="only render docs/report.png (needs chromium)")
    p.add_argument("files", nargs="*", type=Path, help="docs to process (default: all)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))  # the python snippets import this checkout's package
    if args.report_png:
        print(render_report_png())
        return 0
    files = [f.resolve() for f in args.files] or doc_files()
    problems = []
    with workspace() as cwd:
        for f in files:
            problems += check_file(f, cwd, rewrite=not args.check,
                                   log=lambda m: print(m, file=sys.stderr))
    for msg in problems:
        print(msg)
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

"""A failure's evidence, one click from wherever it is shown: ``<device>/artifacts/<test>/index.html``.

Every failed or errored test of a run gets an artifacts directory holding, besides what the gate saved
there (the engine runs' result JSON and stderr, the first differing token, the replay's mismatch rows,
the logits that differed), an ``index.html``: the test, its outcome, the first line of its reason, the
whole reason, and each file as a link (with its size; a short text file is shown inline). The matrix
cells (console, ``summary.md``, ``matrix.svg``, the nightly's HTML), the failure tables and
``summary.json`` (``problems[].evidence``) point at it. A test that saved no file (an infrastructure
error, XDEV, an interruption) gets the directory with its ``index.html`` alone, so the link never
dangles. The page is static HTML with relative links only: the results directory can be copied, served
or uploaded as a CI artifact and the links still work.
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import quote

from bmoe_ci.reports.records import TestRecord, atomic_write

ARTIFACTS = "artifacts"
INDEX = "index.html"
INLINE_BYTES = 8 * 1024  # text files up to this size are shown on the page, not only linked
DETAILS_CHARS = 40_000  # the reason's full text is cut beyond this (device.json keeps it whole)
_TEXT_SUFFIXES = (".txt", ".csv", ".log", ".md")  # shown inline; the runs' JSON (long) is linked only


MAX_NAME = 96  # a directory name longer than this is cut and told apart by a digest of the whole name


def safe_name(name: str) -> str:
    """A test name as one directory name (what the gate suite's ``artifacts`` fixture also does):
    characters outside ``[A-Za-z0-9._[]-]`` become ``_``, and a name too long for a file system (most
    allow 255 bytes) keeps its head and gets a digest of the whole instead of its tail."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.[]") else "_" for c in name) or "_"
    if safe in (".", ".."):
        safe = safe.replace(".", "_")
    if len(safe) > MAX_NAME:
        safe = f"{safe[: MAX_NAME - 13]}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"
    return safe


def evidence_dir(rec: TestRecord) -> str:
    """The record's artifacts directory, relative to its device's directory: where its files are (the
    first artifact's directory under ``artifacts/``), else ``artifacts/<test name>``."""
    for artifact in rec.artifacts:
        parts = PurePosixPath(artifact).parts
        if len(parts) >= 3 and parts[0] == ARTIFACTS:
            return f"{ARTIFACTS}/{parts[1]}"
    return f"{ARTIFACTS}/{safe_name(rec.name)}"


def evidence_href(rec: TestRecord) -> str:
    """Relative to the run's directory: the record's evidence page."""
    return f"{rec.device}/{evidence_dir(rec)}/{INDEX}"


def href(path: str) -> str:
    """A relative path as a link target (``[``, ``]``, ``'`` and spaces quoted, ``/`` kept)."""
    return quote(path)


def _size(n: int) -> str:
    if n >= 1048576:
        return f"{n / 1048576:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #1f2328; max-width: 80em; }
h1 { font-size: 1.3em; margin-bottom: .2em; } h1 small { font-weight: normal; color: #57606a; font-size: .65em; }
h2 { font-size: 1.05em; margin-top: 1.4em; border-bottom: 1px solid #d0d7de; }
.reason { font-weight: bold; padding: .5em .8em; border-radius: 6px; background: #ffebe9; overflow-wrap: anywhere; }
.reason.error { background: #fff1e5; }
pre { background: #f6f8fa; padding: .6em; overflow-x: auto; font-size: .8em; white-space: pre-wrap;
  overflow-wrap: anywhere; max-height: 40em; }
table { border-collapse: collapse; font-size: .85em; } td, th { border: 1px solid #d0d7de; padding: .25em .5em;
  text-align: left; } th { background: #f6f8fa; } .note { color: #57606a; }
"""


def render(
    rec: TestRecord,
    run: str,
    files: Sequence[tuple[str, int, str | None]],
    links: Sequence[tuple[str, str]] = (),
) -> str:
    """The page of *rec*. *files*: (name, size, inline text or None) of the directory's files;
    *links*: (text, href relative to the page) shown under the title (the run's summary, the
    nightly's report, the test's history)."""
    word = {"fail": "FAIL", "error": "ERROR", "pass": "PASS", "skip": "SKIP"}[rec.outcome]
    what = "a wrong engine result" if rec.outcome == "fail" else "infrastructure or harness: no verdict"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{word} {html.escape(rec.name)} on {html.escape(rec.device)}: bmoe-ci run {html.escape(run)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{word} {html.escape(rec.name)} on {html.escape(rec.device)} <small>run {html.escape(run)}, gate "
        f"{html.escape(rec.gate)}{', fixture ' + html.escape(rec.fixture) if rec.fixture else ''}</small></h1>",
    ]
    if links:
        out.append("<p>" + " · ".join(f'<a href="{html.escape(h)}">{html.escape(t)}</a>' for t, h in links) + "</p>")
    klass = "reason" if rec.outcome == "fail" else "reason error"
    out.append(f'<p class="{klass}" id="reason">{html.escape(rec.message or word)}</p>')
    out.append(f'<p class="note">{word.lower()}: {what}.</p>')
    if files:
        out.append('<h2 id="files">Files</h2><table><tr><th>file</th><th>size</th></tr>')
        out += [
            f'<tr><td><a href="{html.escape(href(name))}">{html.escape(name)}</a></td>'
            f"<td>{_size(size) if size else 'empty'}</td></tr>"
            for name, size, _ in files
        ]
        out.append("</table>")
        for name, _, text in files:
            if text is not None:
                out.append(f"<h2>{html.escape(name)}</h2><pre>{html.escape(text)}</pre>")
    else:
        out.append('<p class="note" id="files">The test saved no file; its reason is all there is.</p>')
    details = rec.details or ""
    if details and details.strip() != (rec.message or "").strip():
        cut = details if len(details) <= DETAILS_CHARS else details[:DETAILS_CHARS] + "\n… (cut: device.json has it)"
        out.append(f'<h2 id="details">The whole reason</h2><pre>{html.escape(cut)}</pre>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _files(directory: Path) -> list[tuple[str, int, str | None]]:
    out: list[tuple[str, int, str | None]] = []
    if not directory.is_dir():
        return out
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != INDEX):
        rel = path.relative_to(directory).as_posix()
        size = path.stat().st_size
        text = None
        if 0 < size <= INLINE_BYTES and path.suffix in _TEXT_SUFFIXES:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = None
        out.append((rel, size, text))
    return out


def write_evidence(
    root: Path, run: str, records: Sequence[TestRecord], links: Sequence[tuple[str, str]] = ()
) -> dict[tuple[str, str], str]:
    """Write the evidence page of every failed or errored record under *root* (a run's directory);
    returns (device, test name) -> the page, relative to *root*. *links*: (text, href relative to
    *root*, where ``{device}`` and ``{name}`` stand for the record's device and :func:`safe_name` of its
    test) every page links to when the file exists (made relative to the page)."""
    pages: dict[tuple[str, str], str] = {}
    for rec in records:
        if rec.outcome not in ("fail", "error"):
            continue
        rel = evidence_href(rec)
        page = root / rel
        up = "../" * (len(PurePosixPath(rel).parts) - 1)
        targets = [(text, target.format(device=rec.device, name=safe_name(rec.name))) for text, target in links]
        own = [(text, up + target) for text, target in targets if (root / target).exists()]
        atomic_write(page, render(rec, run, _files(page.parent), own).encode("utf-8"))
        pages[(rec.device, rec.name)] = rel
    return pages


__all__ = ["ARTIFACTS", "INDEX", "evidence_dir", "evidence_href", "href", "render", "safe_name", "write_evidence"]

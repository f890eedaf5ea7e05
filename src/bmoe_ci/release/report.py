"""release.json, release.md and release.html (one self-contained page: inline CSS and SVG, no script),
all three from the same dict, so they cannot disagree. Every check row names the run, device and engine
build its number came from."""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

from bmoe_ci.nightly.report import REPORT_CSS, import_matplotlib
from bmoe_ci.reports.records import atomic_write, write_json

RELEASE_JSON, RELEASE_MD, RELEASE_HTML = "release.json", "release.md", "release.html"
HEADER = ["setting", "requirement", "class", "status", "value", "threshold", "detail", "run", "device", "build"]


def _setting(v: Any) -> str:
    return "off" if v is None else str(v)


def verdict_line(r: dict[str, Any]) -> str:
    return f"{r['verdict']}: {r['reason']}"


def _rows(r: dict[str, Any]) -> list[list[str]]:
    out = []
    for c in r["checks"]:
        ev = c["evidence"] or {}
        out.append(
            [
                c["setting"],
                c["requirement"],
                c["device_class"] or "-",
                c["status"].upper(),
                "" if c["value"] is None else str(c["value"]),
                c["threshold"],
                c["detail"],
                f"{ev.get('run', '')}{' (' + ev['source'] + ')' if ev.get('source') else ''}",
                ev.get("device", ""),
                ev.get("build_id", ""),
            ]
        )
    return out


def _speed_rows(r: dict[str, Any]) -> list[list[str]]:
    out = []
    for cls, ab in r["ab"].items():
        for name, c in ab["configs"].items():
            ratio = ab["ratios"].get(name)
            out.append(
                [
                    cls,
                    ab["device"],
                    name,
                    " ".join(c["flags"]),
                    f"{c['tok_s_mean']:.2f}",
                    "-" if c["step_ms_median"] is None else f"{c['step_ms_median']:.3f}",
                    f"{c['flash_bytes_per_token']:.0f}",
                    "-" if c["hit_rate"] is None else f"{c['hit_rate']:.3f}",
                    f"{ratio['ratio']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}]" if ratio else "-",
                    ab["run"],
                    ab["engine_build_id"],
                ]
            )
    return out


SPEED_HEADER = [
    "class",
    "device",
    "config",
    "flags",
    "tok/s",
    "median step ms",
    "flash B/token",
    "hit rate",
    "B/A [interval]",
    "run",
    "build",
]


def _md(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["_none_", ""]
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(_md(c) for c in row) + " |" for row in rows),
        "",
    ]


def markdown(r: dict[str, Any]) -> str:
    lines = [
        f"# bmoe-ci release-gate {r['run']}",
        "",
        f"**{verdict_line(r)}**",
        "",
        f"Proposal {r['proposed']} against {r['base']}, policy {r['policy']}, pool {r['pool']}, evidence "
        f"{r['evidence_mode']}; exit {r['exit_code']}. Engine builds: "
        f"{', '.join(f'{t} {b}' for t, b in r['engine_builds'].items()) or 'none needed'}.",
        "",
        "## Changed settings",
        "",
    ]
    lines += _md_table(
        ["setting", "base", "proposed"],
        [[c["setting"], _setting(c["base"]), _setting(c["proposed"])] for c in r["changes"]],
    )
    lines += ["## Requirements", "", *_md_table(HEADER, _rows(r))]
    lines += ["## Speed (bmoe-ci ab)", "", *_md_table(SPEED_HEADER, _speed_rows(r))]
    if r.get("not_measured"):
        lines += ["## Not measured (a requirement had already failed)", ""]
        lines += [f"- {k}" for k in r["not_measured"]] + [""]
    if r["stale"]:
        lines += ["## Refused evidence", ""] + [f"- {s['reason']}" for s in r["stale"]] + [""]
    if r["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in r["notes"]] + [""]
    return "\n".join(lines)


def speed_svg(r: dict[str, Any]) -> str | None:
    """Per class: each cell's tok/s of A and B (and sweep widths), in run order."""
    if not r["ab"]:
        return None
    FigureCanvasSVG, Figure = import_matplotlib()
    fig = Figure(figsize=(9, 2.8 * len(r["ab"])))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.9, bottom=0.15, hspace=0.5)
    FigureCanvasSVG(fig)
    axes = fig.subplots(len(r["ab"]), 1, squeeze=False)[:, 0]
    for ax, (cls, ab) in zip(axes, r["ab"].items(), strict=True):
        for name in ab["configs"]:
            cells = [c for c in ab["cells"] if c["config"] == name]
            ax.plot([c["index"] for c in cells], [c["tok_s"] for c in cells], marker="o", linestyle="", label=name)
        ax.set_title(f"{cls}: {ab['device']}, run {ab['run']}", fontsize=9)
        ax.set_ylabel("tok/s")
        ax.set_xlabel("cell (ABBA order)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg") :]


def _table(header: list[str], rows: list[list[str]], klass: str = "") -> str:
    if not rows:
        return '<p class="empty">none</p>'
    out = [
        f"<table{f' class={klass!r}' if klass else ''}><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in header)
        + "</tr>"
    ]
    for row in rows:
        status = row[3].lower() if len(row) > 3 else ""
        out.append(f'<tr class="{html.escape(status)}">' + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


_EXTRA_CSS = "tr.fail td { background: #ffebe9; } tr.missing td { background: #fff8c5; }"


def render_html(r: dict[str, Any], speed: str | None) -> str:
    klass = {"GO": "ok", "NO-GO": "fail"}.get(r["verdict"], "none")
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>bmoe-ci release-gate {html.escape(r['run'])}</title>",
        f"<style>{REPORT_CSS}{_EXTRA_CSS}</style></head><body>",
        f"<h1>bmoe-ci release-gate {html.escape(r['run'])}</h1>",
        f'<p class="verdict {klass}" id="verdict">{html.escape(verdict_line(r))}</p>',
        f"<p>Proposal {html.escape(r['proposed'])} against {html.escape(r['base'])}; policy "
        f"{html.escape(r['policy'])}; pool {html.escape(r['pool'])}; evidence {html.escape(r['evidence_mode'])}; "
        f"exit {r['exit_code']}. Engine builds: "
        + html.escape(", ".join(f"{t} {b}" for t, b in r["engine_builds"].items()) or "none needed")
        + ".</p>",
        '<h2 id="changes">Changed settings</h2>',
        _table(
            ["setting", "base", "proposed"],
            [[c["setting"], _setting(c["base"]), _setting(c["proposed"])] for c in r["changes"]],
        ),
        f'<h2 id="requirements">Requirements ({len(r["checks"])})</h2>',
        _table(HEADER, _rows(r)),
        '<h2 id="speed">Speed (bmoe-ci ab)</h2>',
        _table(SPEED_HEADER, _speed_rows(r)),
    ]
    if speed:
        out.append(f'<figure id="speed-plot">{speed}</figure>')
    if r.get("not_measured"):
        out.append(
            '<h2 id="not-measured">Not measured (a requirement had already failed)</h2><ul>'
            + "".join(f"<li>{html.escape(k)}</li>" for k in r["not_measured"])
            + "</ul>"
        )
    if r["stale"]:
        out.append(
            '<h2 id="stale">Refused evidence</h2><ul>'
            + "".join(f"<li>{html.escape(s['reason'])}</li>" for s in r["stale"])
            + "</ul>"
        )
    if r["notes"]:
        out.append("<h2>Notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in r["notes"]) + "</ul>")
    out.append(
        f'<h2>Files</h2><ul><li><a href="{RELEASE_JSON}">{RELEASE_JSON}</a></li>'
        f'<li><a href="{RELEASE_MD}">{RELEASE_MD}</a></li>' + _evidence_link(r) + "</ul></body></html>"
    )
    return "\n".join(out) + "\n"


def _evidence_link(r: dict[str, Any]) -> str:
    """The evidence file sits beside a gathering run's report; a re-judged one names the directory."""
    if not r.get("evidence"):
        return ""
    where = str(Path(r["rejudged_from"]).resolve() / r["evidence"]) if r.get("rejudged_from") else r["evidence"]
    return f'<li><a href="{html.escape(where)}">{html.escape(where)}</a> (what the verdict was judged on)</li>'


def write_release(out: Path, r: dict[str, Any]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / RELEASE_JSON, r)
    atomic_write(out / RELEASE_MD, markdown(r).encode("utf-8"))
    path = out / RELEASE_HTML
    atomic_write(path, render_html(r, speed_svg(r)).encode("utf-8"))
    return path

"""Small HTML builders for the console: every text goes through `esc`, every page through `page`."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d2733;background:#f6f7f9}
header{background:#1d2733;color:#fff;padding:10px 24px;display:flex;gap:22px;align-items:baseline}
header a{color:#cfe3ff;text-decoration:none}header a:hover{text-decoration:underline}
header .brand{font-weight:700;color:#fff;font-size:18px}main{padding:18px 24px;max-width:1280px}
h1{font-size:22px;margin:4px 0 10px}h2{font-size:17px;margin:22px 0 8px}h3{font-size:14px;margin:14px 0 6px}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0 12px}
th,td{border:1px solid #dde1e6;padding:4px 8px;text-align:left;vertical-align:top}th{background:#eef1f4}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.pass,.ok,.promote,.advance,.better,.confirm,.resolved{color:#1b6e2a;font-weight:600}
.fail,.alert,.rollback,.halt,.worse,.critical,.escalated{color:#b3261e;font-weight:600}
.wait,.hold,.warn,.inconclusive,.warning{color:#9a6700;font-weight:600}
.muted{color:#66707a}.card{background:#fff;border:1px solid #dde1e6;padding:10px 14px;margin:8px 0;border-radius:4px}
.grid{display:flex;flex-wrap:wrap;gap:14px}.grid>.card{flex:1 1 280px}
code{background:#eef1f4;padding:1px 4px;border-radius:3px}svg{background:#fff;border:1px solid #dde1e6}
a{color:#0b57d0}
"""
NAV = (("/", "Home"), ("/catalog", "Catalog"), ("/models", "Models"), ("/rollouts", "Rollouts"),
       ("/alerts", "Alerts"), ("/drift", "Drift & quality"), ("/consistency", "Consistency"))


def esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def link(href: str, text: Any, title: str = "") -> str:
    extra = f" title='{esc(title)}'" if title else ""
    return f"<a href='{esc(href)}'{extra}>{esc(text)}</a>"


_DECISION_REF = re.compile(r"decision #(\d+)")


def text_with_links(value: Any) -> str:
    """Escaped text whose "decision #N" mentions link to the decision."""
    return _DECISION_REF.sub(lambda m: f"<a href='/decisions/{m.group(1)}'>decision #{m.group(1)}</a>", esc(value))


def badge(status: Any) -> str:
    text = str(status)
    return f"<span class='{esc(text.replace(' ', '-'))}'>{esc(text)}</span>"


def num(value: Any, digits: int = 4) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "–"
    if isinstance(value, float) and not math.isfinite(value):
        return "–"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.3g}" if value != 0 and abs(value) < 10 ** -digits else f"{value:.{digits}f}"


P_FLOOR = 1e-16  # a smaller p-value (2.6e-321) says only "very small": doubles cannot resolve it against 1


def pvalue(value: Any) -> str:
    """A p-value as escaped text: "< 1e-16" below what a double resolves, else as `num` shows it."""
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < P_FLOOR:
        return esc(f"< {P_FLOOR:g}")
    return num(value)


def moments(values: Any) -> str:
    """A decision's data window ({name: ISO time}) as readable text."""
    return ", ".join(f"{k.replace('_', ' ')} {when(v)}" for k, v in dict(values or {}).items() if v) or "–"


def when(value: datetime | str | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return esc(value)
    return esc(f"{value:%Y-%m-%d %H:%M}")


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, numeric: Sequence[int] = (),
          empty: str = "none", id_: str = "") -> str:
    """A table of already-escaped cells; `numeric`: column indexes aligned right."""
    body = "".join("<tr>" + "".join(f"<td class='num'>{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    if not body:
        return f"<p class='muted'>{esc(empty)}</p>"
    ident = f" id='{esc(id_)}'" if id_ else ""
    return f"<table{ident}><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + f"</tr>{body}</table>"


def facts(items: Iterable[tuple[str, str]]) -> str:
    """A two-column table of (label, escaped html) rows."""
    return "<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items) + "</table>"


def page(title: str, body: str, project: str = "") -> str:
    nav = "".join(link(href, text) for href, text in NAV)
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{esc(title)} · Quiver</title>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
            f"<body><header><span class='brand'>Quiver</span>{nav}<span class='muted'>project "
            f"{esc(project)} · read-only</span></header><main><h1>{esc(title)}</h1>{body}</main></body></html>")

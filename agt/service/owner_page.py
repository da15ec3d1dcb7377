"""The owner's page of the prediction service: plain HTML with server-drawn SVG charts.

`login_page` is the form that posts the owner's key (in the body, never in the URL; the
service sets no cookie; a browser's password manager may still offer to keep it).
`overview_page` draws what `PredictionService.overview` gathers: the mechanism and its
guarantee, the dataset's composed spend after each charge against its budget, per client
its spend and charges (the ledger's record) and its answered, cached and refused counts
since the process started, and a histogram of the stability radii of answered queries. The
radii are owner-only values: this page is served to the owner's key alone. No script, no
external asset: the page's Content-Security-Policy forbids both.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

#: headers of every owner page: no caching, no referrer, no framing, nothing loaded
HEADERS = {
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
                               "form-action 'self'; frame-ancestors 'none'",
}

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 64rem;
       color: #1d2433; padding: 0 1rem; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.muted { color: #5b6475; } .error { color: #a4161a; font-weight: 600; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: right; padding: .3rem .6rem; border-bottom: 1px solid #dde1e8; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
th { background: #f2f4f8; font-weight: 600; }
.cards { display: flex; gap: 1rem; flex-wrap: wrap; }
.card { border: 1px solid #dde1e8; border-radius: 6px; padding: .6rem .9rem; min-width: 11rem; }
.card b { display: block; font-size: 1.25rem; }
svg text { font: 12px system-ui, sans-serif; fill: #1d2433; }
form { margin-top: 1.5rem; } input[type=password] { width: 24rem; padding: .3rem; }
"""


def _doc(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body>{body}</body></html>")


def login_page(message: str = "") -> str:
    """The form that asks for the owner's key and posts it to ``/owner``.

    Args:
        message: a refusal to show above the form ("" for none).

    Returns:
        The HTML document.
    """
    error = f'<p class="error" id="error">{html.escape(message)}</p>' if message else ""
    return _doc("agt: owner's page", (
        "<h1>The owner's page</h1>"
        "<p class=\"muted\">The model owner's view of the privacy ledger. Give the owner's "
        "API key: it is posted, never put in the address, and the service sets no cookie "
        "(a browser's password manager may still offer to save it: decline).</p>" + error +
        "<form method=\"post\" action=\"/owner\" autocomplete=\"off\">"
        "<label for=\"key\">Owner key</label> "
        "<input type=\"password\" id=\"key\" name=\"key\" required> "
        "<button type=\"submit\" id=\"open\">Open</button></form>"))


def _fmt(x: float | None) -> str:
    if x is None:
        return "&ndash;"
    return f"{x:.6g}"


def spend_chart(curve: list[dict], budget_epsilon: float, *, width: int = 720,
                height: int = 240) -> str:
    """An SVG line of the dataset's composed epsilon after each charge, with the budget.

    Args:
        curve: points ``{"charges": m, "epsilon": eps_m, "time": ...}``, m increasing.
        budget_epsilon: the ledger's total epsilon (drawn as a dashed line).
        width: the drawing's width in pixels.
        height: its height in pixels.

    Returns:
        An ``<svg>`` element (a note instead where nothing was charged yet).
    """
    if not curve:
        return '<p class="muted" id="spend-empty">Nothing was charged yet.</p>'
    left, right, top, bottom = 60, 16, 14, 36
    w, h = width - left - right, height - top - bottom
    m_max = max(p["charges"] for p in curve)
    y_max = max(budget_epsilon, max(p["epsilon"] for p in curve)) or 1.0

    def xy(m: float, eps: float) -> tuple[float, float]:
        return left + w * m / m_max, top + h * (1 - eps / y_max)

    points = [xy(0, 0.0)] + [xy(p["charges"], p["epsilon"]) for p in curve]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    _, y_budget = xy(0, budget_epsilon)
    ticks = "".join(
        f'<text x="{left - 6}" y="{top + h * (1 - f) + 4:.1f}" text-anchor="end">'
        f"{y_max * f:.6g}</text>" for f in (0, 0.5, 1))
    return (
        f'<svg id="spend-chart" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>composed epsilon spent after each charge</title>"
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#f8f9fb" '
        f'stroke="#dde1e8"/>'
        f'<line x1="{left}" x2="{left + w}" y1="{y_budget:.1f}" y2="{y_budget:.1f}" '
        f'stroke="#a4161a" stroke-dasharray="6 4"/>'
        f'<text x="{left + w - 4}" y="{y_budget - 5:.1f}" text-anchor="end">budget '
        f"{budget_epsilon:.6g}</text>"
        f'<polyline points="{path}" fill="none" stroke="#1f5fbf" stroke-width="2"/>'
        f"{ticks}"
        f'<text x="{left}" y="{height - 10}">0</text>'
        f'<text x="{left + w}" y="{height - 10}" text-anchor="end">{m_max} charges</text>'
        f'<text x="8" y="{top + h / 2:.1f}" transform="rotate(-90 8 {top + h / 2:.1f})" '
        f'text-anchor="middle" dominant-baseline="hanging">epsilon</text>'
        f'<text x="{left + w / 2:.1f}" y="{height - 10}" text-anchor="middle">'
        f"charges recorded (oldest first)</text></svg>")


def radius_histogram(counts: dict[int, int] | None, *, width: int = 720,
                     height: int = 220) -> str:
    """An SVG bar chart: how many answered queries had each stability radius.

    Args:
        counts: radius -> number of queries (None: the mechanism computes no radii).
        width: the drawing's width in pixels.
        height: its height in pixels.

    Returns:
        An ``<svg>`` element, or a note where there is nothing to draw.
    """
    if counts is None:
        return ('<p class="muted" id="radii-none">This mechanism does not use the queries\' '
                "radii, so the service does not compute them.</p>")
    if not counts:
        return '<p class="muted" id="radii-empty">No query was answered yet.</p>'
    left, right, top, bottom = 50, 16, 14, 36
    w, h = width - left - right, height - top - bottom
    lo, hi = min(counts), max(counts)
    span = hi - lo + 1
    peak = max(counts.values())
    bar = w / span
    bars = []
    for r, c in sorted(counts.items()):
        bh = h * c / peak
        x = left + bar * (r - lo)
        bars.append(f'<rect class="bar" data-radius="{r}" data-count="{c}" x="{x:.1f}" '
                    f'y="{top + h - bh:.1f}" width="{max(bar - 1, 1):.1f}" height="{bh:.1f}" '
                    f'fill="#1f5fbf"><title>radius {r}: {c} queries</title></rect>')
    return (
        f'<svg id="radius-histogram" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>stability radii of answered queries</title>"
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#f8f9fb" '
        f'stroke="#dde1e8"/>{"".join(bars)}'
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{peak}</text>'
        f'<text x="{left - 6}" y="{top + h}" text-anchor="end">0</text>'
        f'<text x="{left}" y="{height - 10}">radius {lo}</text>'
        f'<text x="{left + w}" y="{height - 10}" text-anchor="end">radius {hi}</text>'
        f"</svg>")


def overview_page(data: dict) -> str:
    """The owner's page for `PredictionService.overview`'s dict (see the module docstring).

    Args:
        data: the overview (``info``, ``ledger``, ``curve``, ``clients``, ``radii``,
            ``started``).

    Returns:
        The HTML document.
    """
    info, ledger = data["info"], data["ledger"]
    g = info["guarantee"]
    budget, spent = ledger["budget"], ledger["spent"]
    started = datetime.fromtimestamp(data["started"], timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")
    cards = "".join(
        f'<div class="card"><span class="muted">{label}</span><b id="{key}">{value}</b></div>'
        for label, key, value in (
            ("epsilon spent", "spent-epsilon", _fmt(spent["epsilon"])),
            ("epsilon budget", "budget-epsilon", _fmt(budget["epsilon"])),
            ("delta spent / budget", "spent-delta",
             f"{_fmt(spent['delta'])} / {_fmt(budget['delta'])}"),
            ("charges recorded", "charges", str(ledger["charges"]))))
    rows = "".join(
        f'<tr data-client="{html.escape(c["id"])}"><td><code>{html.escape(c["id"])}</code></td>'
        f'<td>{html.escape(c.get("name") or "")} <span class="muted">'
        f'{html.escape(c["role"])}</span></td>'
        f'<td class="spent">{_fmt(c["spent"]["epsilon"])}</td>'
        f'<td>{"&ndash;" if c["budget"] is None else _fmt(c["budget"]["epsilon"])}</td>'
        f'<td class="charges">{c["charges"]}</td><td class="answered">{c["answered"]}</td>'
        f'<td class="cached">{c["cached"]}</td><td class="refused">{c["refused"]}</td></tr>'
        for c in data["clients"])
    body = (
        f"<h1>The owner's page</h1>"
        f'<p class="muted">Owner-only: the radii below are private values. Served '
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M:%S UTC')}.</p>"
        f"<h2>Mechanism and guarantee</h2>"
        f'<p id="mechanism"><b>{html.escape(info["mechanism"])}</b> from a '
        f"{html.escape(info['source'])}: ({_fmt(g['epsilon'])}, {_fmt(g['delta'])})-DP per "
        f"{html.escape(g['per'])} under {html.escape(g['relation'])}; the "
        f"{html.escape(ledger['accountant'])} accountant composes the ledger.</p>"
        f'<p class="muted">{html.escape(g.get("statement") or "")}</p>'
        f'<h2>The dataset\'s budget</h2><div class="cards">{cards}</div>'
        f"<p>Composed epsilon after each charge (sampled at up to 48 points):</p>"
        f"{spend_chart(data['curve'], budget['epsilon'])}"
        f"<h2>Clients</h2>"
        f'<table id="clients"><thead><tr><th>key id</th><th>name</th><th>epsilon spent</th>'
        f"<th>budget</th><th>charges</th><th>answered</th><th>cached</th><th>refused</th>"
        f"</tr></thead><tbody>{rows}</tbody></table>"
        f'<p class="muted">Spent and charges: the ledger\'s record. Answered (new labels), '
        f"cached (labels released before, free) and refused (requests): counted by this "
        f"server process since {started}.</p>"
        f"<h2>Stability radii of answered queries</h2>"
        f"{radius_histogram(data['radii'])}"
        f'<p class="muted">Queries answered anew by this process since {started}.</p>')
    return _doc("agt: owner's page", body)

"""The job page's first view, rendered on the server from the page's JSON (`assemble`).

`GET /` answers the page with the job already in it (state, headline, summary, members, epochs,
payouts, slashes, and what the loss curve waits for), as the page's script draws them from
`/api/job`, so a browser without scripts (or a screenshot taken before they run) shows the job;
the script then redraws the same parts on every poll, and draws the loss curve. Each part here
mirrors the script function of the same name in `jobpage.PAGE`: the texts must read the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

COLORS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d"]
ENDED = ("completed", "failed", "cancelled")

Data = Mapping[str, Any]


def el(tag: str, attrs: Mapping[str, Any] | None = None, *children: str) -> str:
    """An element; `children` are HTML already (escape text with `text`)."""
    a = "".join(f' {k}="{escape(str(v))}"' for k, v in (attrs or {}).items())
    return f"<{tag}{a}>{''.join(children)}</{tag}>"


def text(s: Any) -> str:
    return escape(str(s), quote=False)


def short(a: str) -> str:
    return a[:6] + "\u2026" + a[-4:]


def colors(d: Data) -> dict[str, str]:
    """Each member's colour, assigned in the script's order (members now, then each epoch's,
    then the loss series')."""
    out: dict[str, str] = {}
    names = [*d["members"], *(m for e in d["epochs"] for m in e["members"])]
    for m in [*names, *(s["member"] for s in d["loss"]["series"])]:
        out.setdefault(m, COLORS[len(out) % len(COLORS)])
    return out


def _swatch(color: str) -> str:
    return el("span", {"class": "swatch", "style": f"background:{color}"})


def addr(a: str) -> str:
    return el("span", {"class": "addr", "title": a}, text(a))


def member(m: str, color: Mapping[str, str]) -> str:
    return el("span", {"class": "who"}, _swatch(color.get(m, "#999")), addr(m))


def who(m: str, color: Mapping[str, str]) -> str:
    return el("span", {"class": "who", "title": m}, _swatch(color.get(m, "#999")), text(short(m)))


def cell(s: Any, cls: str | None = None) -> str:
    return el("td", {"class": cls} if cls else {}, text(s))


def amount(a: Mapping[str, str]) -> str:
    return el("td", {"class": "num", "data-wei": a["wei"]}, text(a["text"]))


def taking(d: Data) -> str:
    took = len({m for e in d["epochs"] for m in e["members"]})
    ended = d["job"]["state"] in ENDED
    return f"{took} operators took part" if ended else f"{len(d['members'])} members now"


def headline(d: Data) -> str:
    j = d["job"]
    paid = d["payouts"]["total"]["total"]["text"]
    return (
        f"epoch {j['epochs_done']}/{j['epochs_total']} done \u00b7 {j['price']['text']} per "
        f"operator-epoch \u00b7 {taking(d)} \u00b7 paid so far {paid}"
    )


def summary(d: Data) -> str:
    j = d["job"]
    rows = [
        ("epochs", f"{j['epochs_done']}/{j['epochs_total']} done"),
        ("price", f"{j['price']['text']} per operator-epoch"),
        ("members", f"{j['min_operators']} to {j['max_operators']} per epoch"),
        ("steps", f"{j['steps_per_epoch']} per epoch, sync every {j['sync_interval']}"),
        ("escrow", f"{j['escrow']['text']} unearned"),
        ("seat bond", j["seat_bond"]["text"]),
        ("model", j["model_uri"] or "-"),
        ("dataset", j["dataset_uri"] or "-"),
        ("checkpoint", j["checkpoint"]),
        ("caller", j["caller"]),
    ]
    if d.get("refund"):
        rows.append(("refund", f"{d['refund']['text']} to the caller"))
    return "".join(el("dt", {}, text(k)) + el("dd", {}, text(v)) for k, v in rows)


def members(d: Data, color: Mapping[str, str]) -> str:
    every = list(dict.fromkeys([*d["members"], *(m for e in d["epochs"] for m in e["members"])]))
    now = set(d["members"])
    items = [
        el(
            "li",
            {"data-member": m},
            _swatch(color.get(m, "#999")),
            addr(m),
            " (member now)" if m in now else "",
        )
        for m in every
    ]
    items += [el("li", {"data-member": m}, addr(m), " (joining)") for m in d["pending_joins"]]
    return "".join(items) or el("li", {}, "nobody yet")


def _names(xs: Sequence[str], color: Mapping[str, str]) -> str:
    return el("td", {}, *([who(m, color) for m in xs] or ["-"]))


def epoch_rows(d: Data, color: Mapping[str, str]) -> str:
    rows = []
    for e in d["epochs"]:
        state = e["status"] + (f" ({e['attempts']} attempts)" if e["attempts"] > 1 else "")
        ckpt = e["checkpoint"][:18] + "\u2026" if e["checkpoint"] else "-"
        cells = [cell(e["epoch"]), cell(state)]
        cells += [_names(e[k], color) for k in ("members", "paid", "slashed")]
        cells.append(el("td", {}, el("code", {}, text(ckpt))))
        rows.append(el("tr", {"data-epoch": e["epoch"]}, *cells))
    return "".join(rows)


PARTS = ("operator", "stakers", "protocol", "developer", "total")


def payout_rows(d: Data, color: Mapping[str, str]) -> tuple[str, str]:
    """The payouts table's body and footer."""
    p = d["payouts"]
    body = "".join(
        el(
            "tr",
            {"data-operator": r["address"]},
            el("td", {}, member(r["address"], color)),
            cell(r["epochs"], "num"),
            *(amount(r[c]) for c in PARTS),
        )
        for r in p["rows"]
    )
    t = p["total"]
    foot = el(
        "tr",
        {"data-total": ""},
        cell("total"),
        cell(t["epochs"], "num"),
        *(amount(t[c]) for c in PARTS),
    )
    return body, foot


def _pc(bps: int) -> str:
    return f"{bps / 100:g}%"


def payout_note(d: Data) -> str:
    p = d["payouts"]
    b = p["split_bps"]
    return ("" if p["rows"] else "Nobody paid yet. ") + (
        f"Each paid operator-epoch: {_pc(b['operator'])} to the operator, {_pc(b['stakers'])} to "
        f"its stake pool, {_pc(b['protocol'])} to the protocol treasury {short(p['treasury'])}, "
        f"{_pc(b['developer'])} to the developer {short(p['developer'])}."
    )


def slash_rows(d: Data, color: Mapping[str, str]) -> str:
    return "".join(
        el(
            "tr",
            {},
            el("td", {}, member(s["operator"], color)),
            cell(s["epoch"]),
            cell(s["reason"]),
            amount(s["amount"]),
            el("td", {}, addr(s["reporter"])),
        )
        for s in d["slashes"]
    )


def loss_note(d: Data) -> str:
    loss = d["loss"]
    waiting = (
        " Waiting for " + ", ".join(loss["waiting"]) + " to appear (a node creates its "
        "--data-dir when it starts)."
        if loss.get("waiting")
        else ""
    )
    sources = ", ".join(loss["sources"])
    if not loss["sources"]:
        return (
            "No metrics given: the curve comes from the members' metrics files "
            f"(`dtrain job watch {d['job']['id']} --web --metrics NODE_DATA_DIR`, once per "
            "member; each node writes metrics.jsonl in its --data-dir)."
        )
    if not any(s["points"] for s in loss["series"]):
        return f"No training rounds of this job yet in {sources}.{waiting}"
    dashed = (
        " Dashed: held-out loss at each epoch's start and end."
        if any(s["points"] for s in loss.get("heldout", []))
        else ""
    )
    return f"Training loss at each sync round, from {sources}.{dashed}{waiting}"


W, H, LEFT, RIGHT, TOP, BOTTOM = 1000, 300, 56, 16, 12, 36  # the chart's viewBox and margins


def js_num(x: float) -> str:
    """A number as JavaScript's String() writes it (5.0 -> "5")."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _svg(tag: str, attrs: Mapping[str, Any], *children: str) -> str:
    return el(
        tag, {k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in attrs.items()}, *children
    )


def _grid(Y: Any, y0: float, y1: float) -> list[str]:
    """The frame and the loss grid with its labels."""
    frame = {"x": LEFT, "y": TOP, "width": W - LEFT - RIGHT, "height": H - TOP - BOTTOM}
    out = [_svg("rect", {**frame, "fill": "#fbfcfd", "stroke": "#dde1e7"})]
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        at = {"x1": LEFT, "x2": W - RIGHT, "y1": Y(v), "y2": Y(v), "stroke": "#eceff3"}
        out.append(_svg("line", at))
        out.append(_svg("text", {"x": LEFT - 6, "y": Y(v) + 4, "text-anchor": "end"}, f"{v:.3f}"))
    return out


def _axes(d: Data, X: Any) -> list[str]:
    """The epoch boundaries with their steps and names, and the axes' titles."""
    spe, total = d["job"]["steps_per_epoch"], d["job"]["epochs_total"]
    out = []
    for e in range(total + 1):
        x = X(e * spe)
        dash = "4 3" if 0 < e < total else ""
        at = {"x1": x, "x2": x, "y1": TOP, "y2": H - BOTTOM, "stroke": "#c9ced6"}
        out.append(_svg("line", {**at, "stroke-dasharray": dash}))
        at = {"x": x, "y": H - BOTTOM + 14, "text-anchor": "middle"}
        out.append(_svg("text", at, str(e * spe)))
        if e < total:
            at = {"x": X(e * spe + spe / 2), "y": TOP + 14, "text-anchor": "middle"}
            out.append(_svg("text", at, f"epoch {e}"))
    mid = TOP + (H - TOP - BOTTOM) / 2
    at = {"x": LEFT + (W - LEFT - RIGHT) / 2, "y": H - 4, "text-anchor": "middle"}
    out.append(_svg("text", at, "training step"))
    at = {"x": 14, "y": mid, "text-anchor": "middle", "transform": f"rotate(-90 14 {mid})"}
    out.append(_svg("text", at, "loss"))
    return out


def _heldout_lines(heldout: list[Data], color: Mapping[str, str], X: Any, Y: Any) -> list[str]:
    """Each member's held-out loss at each epoch's start and end, dashed."""
    out = []
    for s in heldout:
        ps = s["points"]
        at = {
            "class": "heldout",
            "data-member": s["member"],
            "data-points": len(ps),
            "fill": "none",
            "stroke": color.get(s["member"], "#999"),
            "stroke-width": "1.5",
            "stroke-dasharray": "6 4",
            "points": " ".join(f"{X(p['step']):.1f},{Y(p['loss']):.1f}" for p in ps),
        }
        tip = f"{short(s['member'])} held-out loss: {js_num(ps[-1]['loss'])}"
        out.append(_svg("polyline", at, _svg("title", {}, text(tip))))
    return out


def chart(d: Data, color: Mapping[str, str]) -> tuple[str, str]:
    """The loss chart's SVG children and its legend, as the page's script draws them."""
    series = [s for s in d["loss"]["series"] if s["points"]]
    heldout = [s for s in d["loss"].get("heldout", []) if s["points"]]
    pts = [p for s in series + heldout for p in s["points"]]
    j = d["job"]
    x1 = max([j["steps_per_epoch"] * j["epochs_total"], *(p["step"] for p in pts), 1])
    y0, y1 = (min(p["loss"] for p in pts), max(p["loss"] for p in pts)) if pts else (0.0, 1.0)
    pad = (y1 - y0) * 0.08 or 0.5
    y0, y1 = y0 - pad, y1 + pad

    def X(step: float) -> float:
        return LEFT + step / x1 * (W - LEFT - RIGHT)

    def Y(v: float) -> float:
        return TOP + (y1 - v) / (y1 - y0) * (H - TOP - BOTTOM)

    out = _grid(Y, y0, y1) + _axes(d, X)
    for s in series:
        c, ps = color.get(s["member"], "#999"), s["points"]
        line = " ".join(f"{X(p['step']):.1f},{Y(p['loss']):.1f}" for p in ps)
        out.append(
            _svg(
                "polyline",
                {
                    "class": "series",
                    "data-member": s["member"],
                    "data-points": len(ps),
                    "fill": "none",
                    "stroke": c,
                    "stroke-width": 2,
                    "points": line,
                },
            )
        )
        for p in ps:
            tip = f"{short(s['member'])} epoch {p['epoch']} round {p['round']}: {js_num(p['loss'])}"
            at = {"cx": X(p["step"]), "cy": Y(p["loss"]), "r": 3, "fill": c}
            out.append(_svg("circle", at, _svg("title", {}, text(tip))))
    out += _heldout_lines(heldout, color, X, Y)
    legend = "".join(
        el(
            "span",
            {"class": "who"},
            _swatch(color.get(s["member"], "#999")),
            addr(s["member"]),
            text(f" ({len(s['points'])} rounds, last {js_num(s['points'][-1]['loss'])})"),
        )
        for s in series
    )
    return "".join(out), legend


def progress_line(d: Data) -> str:
    """The members' last round from gossip, with the job's ETA (`dtrain job watch`'s line)."""
    from .progress import RoundLine

    p = d.get("progress")
    return RoundLine(**p).text() if p else ""


def slots(d: Data) -> dict[str, str]:
    """The page's slots (HTML) for the job `d`."""
    color = colors(d)
    j = d["job"]
    body, foot = payout_rows(d, color)
    svg, legend = chart(d, color)
    return {
        "title": text(f"dtrain job {j['id']}: {j['state']}"),
        "view": "server",
        "job_id": text(j["id"]),
        "method": text(j["method"]),
        "state": text(j["state"]),
        "headline": text(headline(d)),
        "progress": text(progress_line(d)),
        "updated": text(f"block {d['block']}, read by the server; the page's script refreshes it"),
        "loss_note": text(loss_note(d)),
        "loss_chart": svg,
        "legend": legend,
        "payout_rows": body,
        "payout_total": foot,
        "payout_note": text(payout_note(d)),
        "epoch_rows": epoch_rows(d, color),
        "slashes_hidden": "" if d["slashes"] else " hidden",
        "slash_rows": slash_rows(d, color),
        "slash_note": "" if d["slashes"] else "No slashes.",
        "members": members(d, color),
        "summary": summary(d),
    }


EMPTY = {
    "title": "dtrain job",
    "view": "loading",
    "job_id": "?",
    "state": "loading",
    "slashes_hidden": " hidden",
}


def render(template: str, d: Data | None, error: str = "") -> str:
    """`template` with its `{{slot}}`s filled for the job `d`; without it (the chain could not
    be read) the empty page that says why and lets the script try again."""
    filled = (
        slots(d) if d is not None else {**EMPTY, "updated": text(error or "reading the chain...")}
    )
    out = template
    for name in SLOTS:
        out = out.replace("{{" + name + "}}", filled.get(name, ""))
    return out


SLOTS = (
    "title",
    "view",
    "job_id",
    "method",
    "state",
    "headline",
    "progress",
    "updated",
    "loss_note",
    "loss_chart",
    "legend",
    "payout_rows",
    "payout_total",
    "payout_note",
    "epoch_rows",
    "slashes_hidden",
    "slash_rows",
    "slash_note",
    "members",
    "summary",
)

"""The pages: each renders the dict its JSON twin answers with (``_data``),
through the escaping helpers of ``_html`` only."""

from __future__ import annotations

from typing import Any

from ._html import Html, age, chart, esc, href, link, page, path_to, payload, table, tag, when

__all__ = ["actions_page", "effect_page", "effects_page", "error_page", "flow_page", "flows_page",
           "health_page", "login_page", "overview_page"]

#: How often a live page fetches itself again (milliseconds).
REFRESH_MS = 2000


def attention_table(base: str, items: list[dict[str, Any]]) -> Html:
    """The attention list as ``inspect`` gives it, each item linked to its flow / effect."""
    rows = [[a["kind"], a["consumer"], link(base, path_to("/flows/", a["flow_id"]), a["flow_id"]), a["seq"],
             a["event_id"], link(base, path_to("/effects/", a["effect_key"]), a["effect_key"]) if a["effect_key"] else None,
             a["reason"], when(a["since"]), a["detail"]] for a in items]
    return table(["kind", "consumer", "flow", "seq", "event", "effect", "reason", "since", "detail"], rows,
                 empty="nothing needs attention", class_="attention")


def overview_page(base: str, data: dict[str, Any]) -> Html:
    cap = data["count_cap"]

    def n(count: int) -> str:  # a count stops at the cap: at least that many
        return f"{count}+" if count >= cap else str(count)

    rows = []
    for c in data["consumers"]:
        rows.append([c["name"], c["location"], n(c["backlog"]), n(c["undelivered"]), n(c["unapplied"]),
                     n(c["in_flight"]), age(c["oldest_unaccepted_age"]), age(c["oldest_unapplied_age"]), c["applied"],
                     ", ".join(f"{n(k)} {s}" for s, k in c["effects"].items() if k) or "-",
                     chart(data["applied_per_minute"].get(c["name"], []),
                           label=f"events applied per minute by {c['name']}")])
    attention = data["attention"]
    produced = data["produced"]
    shown = f"{len(attention)}{'+' if data['attention_more'] else ''}"
    cut = tag("p", f"The first {len(attention)} are shown; reliable-flow inspect lists every one.",
              class_="more") if data["attention_more"] else ""
    body = Html(
        tag("p", "producer ", tag("code", data["producer"]), ": ",
            tag("span", f"{n(produced['events'])} events in {n(produced['flows'])} flows", id="produced"),
            f"; stuck after {data['stuck_after']:g} s; checked ", when(data["checked_at"]))
        + tag("h2", "Consumers")
        + table(["consumer", "location", "backlog", "undelivered", "unapplied", "in flight",
                 "oldest unaccepted", "oldest unapplied", "applied", "effects", "applied per minute"], rows)
        + _timers(data["consumers"]) + _schedules(data["consumers"])
        + tag("h2", f"Needs attention ({shown})", id="attention")
        + attention_table(base, attention) + cut
        + search_form(base, "")
    )
    return page(base, "Overview", body, refresh_ms=REFRESH_MS, api="/api/overview")


def _timers(consumers: list[dict[str, Any]]) -> Html:
    """Per consumer and effect name, the pending effects not due yet (delayed, backing off or rate
    limited) and the earliest due time, as ``inspect`` lists them (none: nothing shown)."""
    rows = [[c["name"], t["name"], t["waiting"], when(t["next_due"])] for c in consumers for t in c.get("timers", [])]
    if not rows:
        return Html("")
    return Html(tag("h2", "Effects waiting for a time", id="timers")
                + table(["consumer", "effect", "waiting", "next due"], rows))


def _schedules(consumers: list[dict[str, Any]]) -> Html:
    """The recurring schedules of every consumer (none: nothing shown)."""
    rows = [[c["name"], s["schedule"], s["name"], f"{s['cron']} ({s['tz']})" if s["cron"] else f"every {s['interval']:g} s",
             "paused" if s["paused"] else "active", when(s["last_tick"]), when(s["next_at"]), s["missed"], s["skipped"]]
            for c in consumers for s in c.get("schedules", [])]
    if not rows:
        return Html("")
    return Html(tag("h2", "Recurring schedules", id="schedules")
                + table(["consumer", "schedule", "effect", "ticks", "state", "last tick", "next tick", "missed",
                         "skipped"], rows))


def search_form(base: str, q: str) -> Html:
    return tag("form", tag("label", "Find a flow by flow id, event id, effect key or correlation id ",
                           tag("input", name="q", value=q, required=True, maxlength=1024, type="search")),
               tag("button", "Find", type="submit"), action=href(base, "/flows"), method="get", class_="filter")


def flows_page(base: str, data: dict[str, Any] | None) -> Html:
    body = search_form(base, "" if data is None else data["q"])
    if data is not None:
        rows = [[link(base, path_to("/flows/", f["flow_id"]), f["flow_id"]), ", ".join(f["matched"])] for f in data["flows"]]
        more = tag("p", f"The first {len(rows)} are shown: narrow the search.", class_="more") if data["more"] else ""
        body = Html(body + tag("h2", "Flows found") + table(["flow", "matched by"], rows,
                                                            empty=f"no flow found for {data['q']!r}") + more)
    return page(base, "Flows", body, api=href("", "/api/flows", None if data is None else {"q": data["q"]}))


def _delivery(d: dict[str, Any] | None) -> Html:
    if d is None:
        return esc("-")
    text = f"{d['state']}, attempts {d['attempts']}"
    if d["last_status"]:
        text += f", answered {d['last_status']}"
    if d["lease_owner"]:
        text += f", lease {'expired' if d['lease_expired'] else 'held'} by {d['lease_owner']}"
    if d["last_error"]:
        text += f", last error: {d['last_error']}"
    return Html(esc(text) + (Html(" until ") + when(d["due_at"]) if d["lease_owner"] or d["due_at"] else ""))


def _effects_table(base: str, effects: list[dict[str, Any]]) -> Html:
    rows = [[link(base, path_to("/effects/", e["key"]), e["key"]), e["name"], e["state"], e["attempts"],
             when(e["due_at"]), e["lease_owner"], e["last_error"], e["reason"], payload(e.get("payload"))]
            for e in effects]
    return table(["key", "name", "state", "attempts", "due", "lease", "last error", "reason", "payload"], rows)


def flow_page(base: str, data: dict[str, Any], acts: bool = False) -> Html:
    names = [c["name"] for c in data["consumers"]]
    produced = data["producer"]["flow"]

    def delivery(e: dict[str, Any], n: str) -> Html:
        shown = _delivery(e["deliveries"].get(n))
        if not acts or e["deliveries"].get(n) is None:
            return shown
        return Html(shown + act_links(base, ("redeliver", "skip-delivery"), {"consumer": n, "event_id": e["event_id"]}))

    events = [[e["seq"], e["event_id"], e.get("kind"), e.get("schema"), payload(e.get("payload")),
               payload(e["meta"]) if e.get("meta") else None,
               *(delivery(e, n) for n in names)] for e in data["producer"]["events"]]
    parts = [tag("p", "producer: ", "no such flow" if produced is None else
                 f"state {produced['state']}, seq {produced['seq']}"),
             tag("h2", "Producer's events"),
             table(["seq", "event", "kind", "schema", "payload", "meta", *(f"to {n}" for n in names)], events)]
    for c in data["consumers"]:
        flow = c["flow"]
        rows = [[r["seq"], r["event_id"], r["state"], r["reason"], r["detail"], when(r["received_at"]),
                 when(r["blocked_at"]),
                 act_links(base, ("skip-event", "replace-event"), {"consumer": c["name"], "event_id": r["event_id"]})
                 if acts and r["state"] in ("pending", "blocked") else None] for r in flow["rows"]]
        parts += [tag("h2", f"Consumer {c['name']}"),
                  tag("p", "Why it waits: ", tag("span", c["why"], class_="why")),
                  tag("p", f"state {flow['state']}, last seq {flow['last_seq']}, next seq {flow['next_seq']}"),
                  tag("h3", "Inbox rows from the next seq on"),
                  table(["seq", "event", "state", "reason", "detail", "received", "blocked", "act"], rows),
                  tag("h3", "Projection"), payload(c["projection"]),
                  tag("h3", "Effects"), _effects_table(base, c["effects"])]
    parts += [tag("h2", f"Needs attention ({len(data['attention'])})"), attention_table(base, data["attention"])]
    return page(base, f"Flow {data['flow_id']}", Html("".join(parts)), refresh_ms=REFRESH_MS,
                api=path_to("/api/flows/", data["flow_id"]))


def effects_page(base: str, data: dict[str, Any], consumers: list[str], states: list[str]) -> Html:
    def options(values: list[str], chosen: str | None, blank: str | None) -> list[Html]:
        out = [tag("option", blank, value="")] if blank is not None else []
        return out + [tag("option", v, value=v, selected=v == chosen) for v in values]

    form = tag("form",
               tag("label", "consumer ", tag("select", *options(consumers, data["consumer"], None), name="consumer")),
               tag("label", "state ", tag("select", *options(states, data["state"], "any"), name="state")),
               tag("label", "name ", tag("input", name="name", value=data["name"] or "", maxlength=128)),
               tag("button", "Show", type="submit"), action=href(base, "/effects"), method="get", class_="filter")
    query = {"consumer": data["consumer"], "state": data["state"], "name": data["name"], "limit": data["limit"]}
    more = link(base, "/effects", "next page", {**query, "after": data["next"]}) if data["next"] else None
    body = Html(form + _effects_table(base, data["effects"])
                + (tag("p", more, class_="pager") if more else Html("")))
    return page(base, "Effects", body, api=href("", "/api/effects", {**query, "after": data["after"]}))


def act_links(base: str, actions: tuple[str, ...], query: dict[str, Any]) -> Html:
    """Links to the forms of ``actions``, filled with ``query`` (shown only with actions allowed)."""
    return tag("span", *(link(base, "/act/" + a, a, query) for a in actions), class_="acts")


def effect_page(base: str, data: dict[str, Any], acts: bool = False) -> Html:
    c = data["consumer"]
    e = c["effect"]
    if e is None:
        head = tag("p", f"not in the effect outbox of {c['name']!r} any more; its history:")
    else:
        head = Html(tag("p", f"{e['name']} of consumer {c['name']}: {e['state']}, attempts {e['attempts']}; flow ",
                        link(base, path_to("/flows/", e["flow_id"]), e["flow_id"]), f" seq {e['seq']} event {e['event_id']}")
                    + (tag("p", "Act on it: ", act_links(base, ("retry", "resolve", "cancel", "amend"),
                                                         {"consumer": c["name"], "key": data["effect_key"]}))
                       if acts else Html(""))
                    + tag("h2", "Payload") + payload(e.get("payload"))
                    + (tag("h2", "Result") + payload(e.get("result")) if e.get("result") is not None else Html("")))
    steps = [tag("li", when(t["at"]), " ", tag("strong", t["transition"]), f" attempt {t['attempt']}",
                 f" [{t['owner']}]" if t["owner"] else "",
                 Html(Html(" due ") + when(t["due_at"])) if t["due_at"] is not None else "",
                 f": {t['detail']}" if t["detail"] else "") for t in c["history"]]
    actions = [[when(a["at"]), a["action"], a["actor"], a["reason"]] for a in c["actions"]]
    body = Html(head + tag("h2", "History") + (tag("ol", *steps, class_="timeline") if steps else
                                               tag("p", "no history", class_="empty"))
                + tag("h2", "Operator actions") + table(["at", "action", "actor", "reason"], actions)
                + tag("h2", "Needs attention") + attention_table(base, data["attention"]))
    return page(base, f"Effect {data['effect_key']}", body, refresh_ms=REFRESH_MS,
                api=path_to("/api/effects/", data["effect_key"]))


def _horizon(action: dict[str, Any]) -> str | None:
    """What a prune acted on: the rows finished before its horizon."""
    return None if action.get("horizon") is None else f"rows before {when(action['horizon'])}"


def actions_page(base: str, data: dict[str, Any], read_only: bool = True) -> Html:
    rows = [[when(a.get("at")), a["store"], a.get("target"), a.get("action"), a.get("actor"),
             a.get("event_id") or a.get("key") or a.get("consumer") or a.get("schedule") or _horizon(a), a.get("reason")]
            for a in data["log"]]
    mode = "read only: this console changes nothing" if read_only else "actions allowed: see "
    body = Html(tag("p", "Every operator action the stores record, newest first (", mode,
                    Html("") if read_only else link(base, "/act", "the action forms"), ").")
                + table(["at", "store", "target", "action", "actor", "on", "reason"], rows,
                        empty="no operator action recorded"))
    return page(base, "Operator actions", body, api="/api/actions")


def health_page(base: str, items: list[dict[str, Any]]) -> Html:
    state = tag("p", "healthy: nothing needs attention" if not items else f"{len(items)} need attention",
                class_="healthy" if not items else "unhealthy")
    return page(base, "Health", Html(state + attention_table(base, items)))


def error_page(base: str, status: str, sentence: str) -> Html:
    return page(base, status, tag("p", sentence))


def login_page(base: str, failed: bool) -> Html:
    form = tag("form", tag("label", "Token ", tag("input", name="token", type="password", required=True)),
               tag("button", "Log in", type="submit"), action=href(base, "/login"), method="post")
    return page(base, "Log in", Html((tag("p", "wrong token") if failed else Html("")) + form))

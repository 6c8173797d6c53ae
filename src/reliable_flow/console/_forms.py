"""The action forms (only with actions allowed): each asks for its target,
the actor and the reason, and carries the CSRF token; a bulk form shows how
many rows its filter selects and offers a dry run before it acts."""

from __future__ import annotations

from collections.abc import Mapping

from ._act import ACTIONS, BULK, RETRYABLE, Action, Field, Preview
from ._html import Html, href, link, page, tag

__all__ = ["act_index", "act_page", "flash"]


def flash(sentence: str) -> Html:
    """The sentence an action left for the page after its redirect."""
    refused = sentence.startswith(("refused", "not done"))
    return tag("p", sentence, class_="flash refused" if refused else "flash", role="status")


def act_index(base: str) -> Html:
    items = [tag("li", link(base, "/act/" + name, a.title), ": ", a.does) for name, a in ACTIONS.items()]
    bulk = [tag("li", link(base, "/act/" + name, a.title), ": ", a.does) for name, a in BULK.items()]
    body = Html(tag("p", "Each action asks who decides and why, and is recorded as the command line records it.")
                + tag("ul", *items) + tag("h2", "Bulk actions (with a dry run)") + tag("ul", *bulk))
    return page(base, "Actions", body)


def _field(f: Field, value: str, consumers: list[str]) -> Html:
    if f.kind in ("consumer", "state", "store"):
        values = {"consumer": consumers, "state": list(RETRYABLE), "store": ["producer", *consumers]}[f.kind]
        options = [tag("option", v, value=v, selected=v == value) for v in values]
        return tag("label", f.label + " ", tag("select", *options, name=f.name, required=True))
    if f.kind == "check":
        return tag("label", tag("input", type="checkbox", name=f.name, value="1", checked=bool(value)), " " + f.label)
    if f.kind == "area":
        return tag("label", f.label + " ", tag("textarea", value, name=f.name, rows=4, cols=60,
                                                required=f.required))
    return tag("label", f.label + " ", tag("input", name=f.name, value=value, required=f.required, maxlength=1024))


def act_page(base: str, name: str, values: Mapping[str, str], csrf: str, consumers: list[str],
             selection: Preview | None = None) -> Html:
    """The form of action ``name``, its fields filled from ``values``; for a
    bulk action, ``selection``: what its filter selects now."""
    bulk = name in BULK
    action: Action = BULK[name] if bulk else ACTIONS[name]
    fields = [_field(f, values.get(f.name, ""), consumers) for f in action.fields]
    who = [tag("label", "actor ", tag("input", name="actor", value=values.get("actor", ""), required=True,
                                      maxlength=200, autocomplete="username")),
           tag("label", "reason ", tag("input", name="reason", value=values.get("reason", ""), required=True,
                                       maxlength=1000))]
    parts = [tag("p", action.does, "; recorded with who, when and why.")]
    if bulk and selection is not None:
        query = {**{f.name: values.get(f.name, "") for f in action.fields}, **selection.hidden}
        rows = selection.rows
        shown = ", ".join(rows[:20]) + (f" and {len(rows) - 20} more" if len(rows) > 20 else "")
        parts += [tag("form", *fields, tag("button", "Select", type="submit"), action=href(base, "/act/" + name),
                      method="get", class_="filter"),
                  tag("p", selection.sentence, ": " + shown if rows else "", class_="selection"),
                  tag("form", *(tag("input", type="hidden", name=k, value=v) for k, v in query.items()),
                      tag("input", type="hidden", name="csrf", value=csrf), *who,
                      tag("button", "Dry run", type="submit", name="mode", value="dry"),
                      tag("button", selection.button, type="submit", name="mode", value="act"),
                      action=href(base, "/act/" + name), method="post", class_="act")]
    else:
        parts.append(tag("form", tag("input", type="hidden", name="csrf", value=csrf), *fields, *who,
                         tag("button", action.title, type="submit"), action=href(base, "/act/" + name),
                         method="post", class_="act"))
    return page(base, action.title, Html("".join(parts)))

"""The Grafana dashboard asks only for metrics the services serve, with labels they carry.

Every PromQL expression of deploy/dashboards/gangline.json (panels and template variables) is parsed
for the metric names it selects and the labels it groups or matches by; each name must be a family of
the catalogue (:data:`gangline.telemetry.metrics.FAMILIES`, histograms by their ``_bucket``/``_sum``/
``_count`` series), one the client library adds to every registry (process_*, python_*), or one
Prometheus itself writes per target (``up``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gangline.telemetry.metrics import FAMILIES, METRICS_PORTS, exposed_names, new_registry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "dashboards" / "gangline.json"

PROMETHEUS_SERIES = {"up": ("job", "instance")}
"""What Prometheus writes for every target it scrapes."""
TARGET_LABELS = {"job", "instance"}
"""The labels Prometheus adds to every scraped series."""
KEYWORDS = {"bool", "and", "or", "unless", "offset"}


def known_series() -> dict[str, set[str]]:
    """Series name → the labels it may carry."""
    known: dict[str, set[str]] = {
        name: {*labels, *TARGET_LABELS} for name, labels in PROMETHEUS_SERIES.items()
    }
    for family in FAMILIES.values():
        for name in exposed_names(family):
            known[name] = {*family.labels, *TARGET_LABELS} | ({"le"} if name.endswith("_bucket") else set())
    for metric in new_registry().collect():
        for sample in metric.samples:
            known.setdefault(sample.name, {*TARGET_LABELS}).update(sample.labels)
    return known


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression in the dashboard: panel targets' ``expr`` and variables' queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if (key == "expr" and isinstance(value, str)) or (
                key == "query" and isinstance(value, str) and value.startswith("label_values(")
            ):
                yield value
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


def selected(expr: str) -> list[tuple[str, set[str]]]:
    """The metrics ``expr`` selects, each with the labels its matchers name and those the expression
    groups by (``by``, ``without``, ``on``, ``ignoring`` lists: checked against each of its metrics)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: no names inside
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range and subquery durations
    if expr.startswith("label_values("):
        inner = expr[len("label_values(") : -1]
        metric, _, label = (part.strip() for part in inner.partition(","))
        return [(metric, {label})]
    grouped: set[str] = set()
    for clause in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        grouped |= {label.strip() for label in clause.group(1).split(",") if label.strip()}
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    found: list[tuple[str, set[str]]] = []
    for match in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?", expr):
        name, matchers = match.group(1), match.group(2) or ""
        rest = expr[match.end() :].lstrip()
        if name in KEYWORDS or rest.startswith("(") or name.startswith("__"):
            continue  # a function, an aggregation, a keyword or a Grafana variable
        if expr[match.start() - 1 : match.start()] == "$":
            continue  # $__rate_interval and friends
        labels = {m.group(1) for m in re.finditer(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers)}
        found.append((name, labels | grouped))
    return found


def test_the_parser_finds_metrics_and_labels_and_skips_functions() -> None:
    expr = 'histogram_quantile(0.9, sum by (le, queue) (rate(gangline_x_bucket{queue=~"$q"}[5m])))'
    assert selected(expr) == [("gangline_x_bucket", {"le", "queue"})]
    assert selected('sum(a{state="allocated"}) / clamp_min(sum(b), 1)') == [("a", {"state"}), ("b", set())]
    assert selected("label_values(gangline_jobs, queue)") == [("gangline_jobs", {"queue"})]


def test_the_dashboard_is_valid_json_with_panels_and_a_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert board["uid"] == "gangline"
    titles = {p["title"] for p in board["panels"] if p["type"] == "row"}
    assert {"Queues", "GPUs", "Waits", "Preemptions", "Service health"} <= titles
    assert any(v["type"] == "datasource" for v in board["templating"]["list"])
    assert sum(1 for _ in expressions(board)) >= 20


@pytest.mark.parametrize("expr", list(expressions(json.loads(DASHBOARD.read_text(encoding="utf-8")))))
def test_every_expression_names_only_metrics_and_labels_that_exist(expr: str) -> None:
    known = known_series()
    series = selected(expr)
    assert series, f"no metric found in {expr!r}"
    for name, labels in series:
        assert name in known, f"{name!r} in {expr!r} is no metric the services serve"
        assert labels <= known[name], f"{sorted(labels - known[name])} are no labels of {name} in {expr!r}"


def test_the_check_catches_a_misspelt_metric_and_a_label_it_lacks() -> None:
    known = known_series()
    [(name, _)] = selected("sum(rate(gangline_decision_total[5m]))")
    assert name not in known
    [(name, labels)] = selected("sum by (queue) (gangline_consumer_lag_records)")
    assert not labels <= known[name]


def test_the_readme_table_lists_every_family_with_its_labels_and_port() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[1].strip(" `"): line
        for line in readme.splitlines()
        if line.startswith("| `gangline_")
    }
    assert set(rows) == set(FAMILIES)
    for name, family in FAMILIES.items():
        assert all(f"`{label}`" in rows[name] for label in family.labels), name
        assert all(f"{s} ({METRICS_PORTS[s]})" in rows[name] for s in family.services), name

"""What a Grafana dashboard asks Prometheus for, and what a `/metrics` page offers: the metric
names in each panel's PromQL and template queries, and the names and labels of a scrape."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# Parts of an expression that hold no metric names: strings, label matchers, ranges, groupings.
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGES = re.compile(r"\[[^\]]*\]")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
# An identifier that is not a function call (those are followed by a parenthesis).
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "inf", "nan"}
_LABEL_VALUES = re.compile(r"label_values\(\s*(?:([\w:]+)\s*,\s*)?(\w+)\s*\)")


def dashboard_queries(path: Path) -> tuple[list[str], list[str]]:
    """The PromQL of every panel target (`expr`) and every templating query of a dashboard."""
    expressions: list[str] = []
    templates: list[str] = []

    def walk(node: object, in_templating: bool) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    expressions.append(value)
                elif key == "query" and in_templating:
                    query = value.get("query") if isinstance(value, dict) else value
                    if isinstance(query, str):
                        templates.append(query)
                else:
                    walk(value, in_templating or key == "templating")
        elif isinstance(node, list):
            for item in node:
                walk(item, in_templating)

    walk(json.loads(path.read_text()), False)
    return expressions, templates


def metric_names(expression: str) -> set[str]:
    """The metric (sample) names a PromQL expression selects."""
    bare = _STRINGS.sub("", expression)
    for pattern in (_MATCHERS, _RANGES, _GROUPINGS):
        bare = pattern.sub(" ", bare)
    return {name for name in _IDENTIFIER.findall(bare) if name.lower() not in _KEYWORDS}


def label_values_queries(templates: list[str]) -> Iterator[tuple[str | None, str]]:
    """(metric or None, label) of each `label_values(...)` template query."""
    for query in templates:
        for metric, label in _LABEL_VALUES.findall(query):
            yield metric or None, label


def exposed(text: str) -> dict[str, set[str]]:
    """Each name a scrape answers to, with the label names its samples carry. A gauge family
    with no samples (nothing waiting at any priority) still counts: a panel finds it once it
    has a value."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        if family.type == "gauge":
            names.setdefault(family.name, set())
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names

"""Prometheus's text exposition format (version 0.0.4), written: metric families with their
``# HELP`` and ``# TYPE`` lines and one sample a line, as Prometheus scrapes them and as
``prometheus-client``'s parser reads them (tests/unit/test_prom_text.py holds the two equal).

The run's judge serves what it writes (agent/judge/prometheus.py, docs/PROMETHEUS.md). Names
follow Prometheus's conventions: a counter's name ends in ``_total`` and its ``# TYPE`` line
names it so, base units in the name (``_bytes``, ``_seconds``), ratios from 0 to 1. Label
values are escaped (``\\``, ``"`` and a newline), HELP text too (``\\`` and a newline); a
value is a float's shortest form, ``NaN``, ``+Inf`` or ``-Inf``.

Plain data, no I/O; standard library only; Python >= 3.9.
"""

import math
import re

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TYPES = ("counter", "gauge", "untyped")
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class Family:
    """One metric: ``name`` (a counter's with its ``_total``), ``kind`` (of :data:`TYPES`),
    ``help`` text and its samples, each ``(labels, value)`` with ``labels`` a dict of label
    name to value (text). ValueError for a name Prometheus would refuse (a programming error:
    names are the judge's own, never a host's)."""

    def __init__(self, name, kind, help_text):
        if not METRIC_NAME.match(name) or kind not in TYPES:
            raise ValueError("not a metric name or type: %r %r" % (name, kind))
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError("a counter's name ends in _total: %r" % name)
        self.name = name
        self.kind = kind
        self.help = help_text
        self.samples = []

    def add(self, labels, value):
        """A sample; a label named against the rules is a ValueError, a value that is no
        number (None, a bool) leaves the sample out."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return
        for key in labels:
            if not LABEL_NAME.match(key) or key.startswith("__"):
                raise ValueError("not a label name: %r" % key)
        self.samples.append((dict(labels), value))


def escape_label(value):
    """A label value as it stands between the quotes: ``\\``, ``"`` and newline escaped."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text):
    """HELP text: ``\\`` and newline escaped (quotes stand as they are)."""
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    """A sample's value: a whole number as digits, a float in its shortest form, ``NaN``,
    ``+Inf``, ``-Inf``."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families):
    """The exposition of ``families`` (Family objects) as text; a family with no sample is
    left out (its HELP and TYPE alone tell a scraper nothing)."""
    out = []
    for fam in families:
        if not fam.samples:
            continue
        out.append("# HELP %s %s\n" % (fam.name, escape_help(fam.help)))
        out.append("# TYPE %s %s\n" % (fam.name, fam.kind))
        for labels, value in fam.samples:
            if labels:
                out.append("%s{%s} %s\n" % (fam.name, ",".join(
                    '%s="%s"' % (k, escape_label(v)) for k, v in labels.items()),
                    format_value(value)))
            else:
                out.append("%s %s\n" % (fam.name, format_value(value)))
    return "".join(out)


def encode(text):
    """The exposition's bytes: UTF-8, with what cannot be encoded (a lone surrogate from a
    host's bytes) replaced."""
    return text.encode("utf-8", "replace")

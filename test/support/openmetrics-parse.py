"""Parses an OpenMetrics exposition from stdin with the Prometheus project's own parser
(prometheus_client.openmetrics.parser, Debian's python3-prometheus-client), unmodified, and prints
the families as JSON (test/metal/metrics.test.ts). The parser refuses what Prometheus' would: a
missing # EOF, a counter without _total, a name that does not end in its unit, bad escapes,
buckets out of order or not adding up, a family's series split apart. A refusal exits 1 with the
parser's reason on stderr.

    python3 openmetrics-parse.py < exposition.txt
"""
import json
import sys

from prometheus_client.openmetrics.parser import text_string_to_metric_families

try:
    families = [
        {
            "name": f.name,
            "type": f.type,
            "unit": f.unit,
            "help": f.documentation,
            "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in f.samples],
        }
        for f in text_string_to_metric_families(sys.stdin.read())
    ]
except ValueError as e:
    sys.exit(f"the OpenMetrics parser refused the exposition: {e}")
json.dump(families, sys.stdout)

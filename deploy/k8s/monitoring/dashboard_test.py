"""The monitoring files: the Grafana dashboard parses, is make_dashboard.py's output, queries
only metrics and labels the shards and workers export, covers the panels an operator needs
first and lays them out without overlap; the Kubernetes YAML parses with the fields
Prometheus needs.

    /usr/bin/python3 -m pytest -q deploy/k8s/monitoring
"""
import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
import make_dashboard  # noqa: E402

SHARD = {"gcomp_job", "shard"}
WORKER = {"gcomp_job", "worker"}
# The metrics of docs/OPERATIONS.md: name -> (type, labels).
METRICS = {
    "gcomp_shard_raw_bytes_total": ("counter", SHARD | {"direction"}),
    "gcomp_shard_wire_bytes_total": ("counter", SHARD | {"direction"}),
    "gcomp_shard_compression_ratio": ("gauge", SHARD | {"direction"}),
    "gcomp_shard_pushes_total": ("counter", SHARD | {"code"}),
    "gcomp_shard_duplicate_pushes_total": ("counter", SHARD),
    "gcomp_shard_steps_completed_total": ("counter", SHARD),
    "gcomp_shard_steps_failed_total": ("counter", SHARD),
    "gcomp_shard_step_duration_seconds": ("histogram", SHARD),
    "gcomp_shard_step_phase_seconds": ("histogram", SHARD | {"phase"}),
    "gcomp_shard_codec_bytes_total": ("counter", SHARD | {"op"}),
    "gcomp_shard_codec_seconds_total": ("counter", SHARD | {"op"}),
    "gcomp_shard_memory_budget_bytes": ("gauge", SHARD),
    "gcomp_shard_memory_used_bytes": ("gauge", SHARD),
    "gcomp_shard_pending_steps": ("gauge", SHARD),
    "gcomp_shard_limit_refusals_total": ("counter", SHARD),
    "gcomp_shard_unread_replies_cancelled_total": ("counter", SHARD),
    "gcomp_shard_stream_limit_closures_total": ("counter", SHARD),
    "gcomp_shard_refused_address_connections_total": ("counter", SHARD),
    "gcomp_shard_chunks_owned": ("gauge", SHARD),
    "gcomp_shard_tensors": ("gauge", SHARD),
    "gcomp_shard_map_epoch": ("gauge", SHARD),
    "gcomp_grpc_calls_in_flight": ("gauge", SHARD | {"method"}),
    "gcomp_worker_raw_bytes_total": ("counter", WORKER | {"direction"}),
    "gcomp_worker_wire_bytes_total": ("counter", WORKER | {"direction"}),
    "gcomp_worker_chunks_total": ("counter", WORKER),
    "gcomp_worker_retries_total": ("counter", WORKER),
    "gcomp_worker_push_pull_seconds": ("histogram", WORKER),
}
# Where each family is defined, to catch a rename on either side.
SOURCES = {"gcomp_shard_": "server/shard_metrics.cc", "gcomp_grpc_": "server/shard_metrics.cc",
           "gcomp_worker_": "worker/client_metrics.cc"}
# PromQL words that may stand before "(" or "{" without being metrics.
PROMQL = {"sum", "rate", "histogram_quantile", "by", "count", "min", "max", "vector", "or"}

DASHBOARD = os.path.join(HERE, "gcomp-dashboard.json")


@pytest.fixture(scope="module")
def dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def targets(dashboard):
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            yield p["title"], t


def metric_tokens(expr):
    """The gcomp_ metric names an expression reads: words outside label matchers, grouping
    clauses and strings (where gcomp_job is a label, not a metric)."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    bare = re.sub(r"\{[^}]*\}", "", bare)
    bare = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", bare)
    return [t for t in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare) if t.startswith("gcomp_")]


def series_name(token):
    """The metric family of a name as queried (histograms as _bucket, _sum or _count)."""
    if token in METRICS:
        return token
    for suffix in ("_bucket", "_sum", "_count"):
        base = token[: -len(suffix)]
        if token.endswith(suffix) and METRICS.get(base, ("",))[0] == "histogram":
            return base
    return None


def test_dashboard_is_the_generators_output():
    with open(DASHBOARD) as f:
        assert f.read() == make_dashboard.render(), \
            "gcomp-dashboard.json is stale: run deploy/k8s/monitoring/make_dashboard.py"


def test_every_metric_queried_is_exported_with_the_labels_used(dashboard):
    used = set()
    for title, t in targets(dashboard):
        expr = t["expr"]
        for token in metric_tokens(expr):
            name = series_name(token)
            assert name is not None, "%s: unknown metric %s in %s" % (title, token, expr)
            used.add(name)
        labels_here = set().union(*(METRICS[series_name(m)][1] for m in metric_tokens(expr)))
        is_histogram = "_bucket" in expr
        for metric, matchers in re.findall(r"(gcomp_[a-z0-9_]+)\{([^}]*)\}", expr):
            allowed = METRICS[series_name(metric)][1] | ({"le"} if metric.endswith("_bucket") else set())
            for label in re.findall(r"([a-zA-Z_]+)\s*(?:=~|!=|!~|=)", matchers):
                assert label in allowed, "%s: %s has no label %s" % (title, metric, label)
        grouped = set()
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels = {g.strip() for g in group.split(",")}
            grouped |= labels
            assert labels <= labels_here | ({"le"} if is_histogram else set()), \
                "%s: groups by unknown labels %s" % (title, labels - labels_here)
        for label in re.findall(r"\{\{(\w+)\}\}", t["legendFormat"]):
            # After sum by (...), only the grouped labels remain; a bare selector keeps all.
            keep = grouped if "sum" in expr or "histogram_quantile" in expr else labels_here
            assert label in keep, "%s: legend names %s, which the query drops" % (title, label)
        for word in re.findall(r"([a-z_]+)\s*\(", expr):
            assert word in PROMQL, "%s: unexpected function %s" % (title, word)
    # The panels an operator needs first.
    for needed in ("gcomp_shard_steps_completed_total", "gcomp_shard_wire_bytes_total",
                   "gcomp_shard_raw_bytes_total", "gcomp_shard_compression_ratio",
                   "gcomp_shard_step_duration_seconds", "gcomp_shard_step_phase_seconds",
                   "gcomp_shard_pushes_total", "gcomp_shard_memory_used_bytes",
                   "gcomp_shard_memory_budget_bytes", "gcomp_shard_pending_steps",
                   "gcomp_grpc_calls_in_flight", "gcomp_shard_codec_bytes_total",
                   "gcomp_shard_codec_seconds_total"):
        assert needed in used, "no panel queries " + needed


def test_metric_names_match_the_exporting_sources(dashboard):
    names = {series_name(m) for _, t in targets(dashboard) for m in metric_tokens(t["expr"])}
    for name in sorted(names):
        source = next(path for prefix, path in SOURCES.items() if name.startswith(prefix))
        path = os.path.join(ROOT, source)
        if not os.path.exists(path):
            pytest.skip("%s not in this checkout" % source)
        with open(path) as f:
            assert '"%s"' % name in f.read(), "%s does not define %s" % (source, name)


def test_panels_have_titles_units_and_do_not_overlap(dashboard):
    cells = {}
    ids = set()
    for p in dashboard["panels"]:
        assert p["title"]
        assert p["id"] not in ids
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"] and p["description"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, "%s overlaps %s" % (p["title"], cells[(x, y)])
                cells[(x, y)] = p["title"]
    names = [v["name"] for v in dashboard["templating"]["list"]]
    assert names == ["datasource", "job"]


def load_yaml(name):
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(HERE, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def test_no_series_label_collides_with_a_label_prometheus_sets():
    for _, labels in METRICS.values():
        assert not labels & {"job", "instance"}, labels


def test_service_monitor_scrapes_metrics_ports_and_keeps_prometheus_labels():
    docs = load_yaml("servicemonitor.yaml")
    services = [d for d in docs if d["kind"] == "Service"]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert not endpoint.get("honorLabels"), "a target could then overwrite job and instance"
    selector = monitor["spec"]["selector"]
    for s in services:
        # gcomp's processes on 9464; etcd's members on their metrics port, 2381.
        port = 2381 if s["metadata"]["name"] == "gcomp-etcd-metrics" else 9464
        assert any(p["name"] == "metrics" and p["port"] == port for p in s["spec"]["ports"])
        labels = s["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector["matchLabels"].items())
        (expr,) = selector["matchExpressions"]
        assert labels[expr["key"]] in expr["values"]


def test_annotation_scrape_config_keeps_annotated_pods_and_prometheus_labels():
    (doc,) = load_yaml("scrape-annotations.yaml")
    (job,) = doc["scrape_configs"]
    assert not job.get("honor_labels")
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep"
    assert keep["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    # The port rewrite: host from the pod address, port from the annotation.
    rewrite = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
    m = re.fullmatch(rewrite["regex"], "10.1.2.3:7070;9464")
    assert m and rewrite["replacement"].replace("$1", m.group(1)).replace("$2", m.group(2)) \
        == "10.1.2.3:9464"

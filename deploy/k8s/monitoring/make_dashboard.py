#!/usr/bin/python3
"""Writes gcomp-dashboard.json (the Grafana dashboard of docs/OPERATIONS.md) next to this
script. Edit the panels here and re-run; dashboard_test.py checks that the JSON is this
script's output and that every metric it queries exists.

    /usr/bin/python3 deploy/k8s/monitoring/make_dashboard.py
"""
import json
import os

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'gcomp_job=~"$job"'
RI = "$__rate_interval"


class Layout:
    """Places panels left to right on Grafana's 24-column grid, rows under titles."""

    def __init__(self):
        self.panels = []
        self.x = 0
        self.y = 0
        self.line_height = 0

    def _end_line(self):
        if self.x > 0:
            self.y += self.line_height
        self.x = 0
        self.line_height = 0

    def row(self, title):
        self._end_line()
        self.panels.append({"type": "row", "title": title, "collapsed": False, "panels": [],
                            "id": len(self.panels) + 1,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def panel(self, title, targets, desc, unit="short", w=12, h=8, kind="timeseries"):
        if self.x + w > 24:
            self._end_line()
        p = {"type": kind, "title": title, "description": desc, "datasource": DS,
             "id": len(self.panels) + 1,
             "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
             "targets": [{"refId": chr(ord("A") + i), "expr": e, "legendFormat": legend,
                          "datasource": DS} for i, (e, legend) in enumerate(targets)],
             "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}
        if kind == "timeseries":
            p["fieldConfig"]["defaults"]["custom"] = {"lineWidth": 1, "fillOpacity": 10}
            p["options"] = {"legend": {"displayMode": "table", "placement": "bottom",
                                       "calcs": ["lastNotNull", "max"]},
                            "tooltip": {"mode": "multi"}}
        else:
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value",
                            "graphMode": "area"}
        self.panels.append(p)
        self.x += w
        self.line_height = max(self.line_height, h)


def rate(metric, matchers=""):
    sel = SEL + ("," + matchers if matchers else "")
    return "rate(%s{%s}[%s])" % (metric, sel, RI)


def quantile(q, histogram, by=""):
    return "histogram_quantile(%s, sum by (le%s) (%s))" % (
        q, ", " + by if by else "", rate(histogram + "_bucket"))


def build():
    d = Layout()
    d.row("Overview")
    stat = dict(w=4, h=4, kind="stat")
    d.panel("Shards reporting", [("count(gcomp_shard_map_epoch{%s})" % SEL, "shards")],
            "Shards whose /metrics answered in the last scrape; compare with the config's "
            "shard count (gcomp_admin status names the missing one).", **stat)
    d.panel("Steps/s (all shards)",
            [("sum(%s)" % rate("gcomp_shard_steps_completed_total"), "chunk-steps/s")],
            "Chunk-steps completed per second over all shards.", **stat)
    for direction, name in (("in", "uplink"), ("out", "downlink")):
        d.panel("Compression ratio (%s)" % name,
                [("sum(%s) / sum(%s)" % (rate("gcomp_shard_raw_bytes_total", 'direction="%s"' % direction),
                                         rate("gcomp_shard_wire_bytes_total", 'direction="%s"' % direction)),
                  name)],
                "Raw over wire bytes (%s), all shards, over the rate window." % (
                    "pushed by workers" if direction == "in" else "of the results"),
                unit="none", **stat)
    d.panel("Rejected pushes/s", [("sum(%s) or vector(0)" % rate("gcomp_shard_pushes_total", 'code!="OK"'),
                                   "rejected")],
            "Pushes answered with an error status; should be 0 (see 'Pushes by status code').",
            **stat)
    d.panel("Shard-map epoch", [("min(gcomp_shard_map_epoch{%s})" % SEL, "min"),
                                ("max(gcomp_shard_map_epoch{%s})" % SEL, "max")],
            "Every shard should be at the same epoch: min below max means a reshard is under "
            "way or a shard runs an old config.", unit="none", **stat)

    d.row("Throughput")
    d.panel("Steps/s by shard",
            [("sum by (shard) (%s)" % rate("gcomp_shard_steps_completed_total"), "shard {{shard}}"),
             ("sum by (shard) (%s)" % rate("gcomp_shard_steps_failed_total"), "failed, shard {{shard}}")],
            "Chunk-steps completed, and failed (deadline or shutdown), per second. A shard below "
            "the others owns fewer chunks or is slow.")
    d.panel("Wire vs raw bytes/s by direction",
            [("sum by (direction) (%s)" % rate("gcomp_shard_wire_bytes_total"), "wire {{direction}}"),
             ("sum by (direction) (%s)" % rate("gcomp_shard_raw_bytes_total"), "raw {{direction}}")],
            "in: pushes from workers; out: results to workers. Raw is the same tensors "
            "uncompressed.", unit="Bps")
    d.panel("Compression ratio by shard",
            [("gcomp_shard_compression_ratio{%s}" % SEL, "shard {{shard}} {{direction}}")],
            "Raw over wire bytes per direction, as each shard reports it.", unit="none")
    d.panel("Codec throughput (GB/s)",
            [("sum by (op) (%s) / sum by (op) (%s) / 1e9" % (rate("gcomp_shard_codec_bytes_total"),
                                                              rate("gcomp_shard_codec_seconds_total")),
              "{{op}}")],
            "Raw bytes decoded or encoded per second of codec time on the shards (per thread, "
            "not wall clock).", unit="none")

    d.row("Latency")
    d.panel("Step latency p50 / p99",
            [(quantile(0.5, "gcomp_shard_step_duration_seconds"), "p50"),
             (quantile(0.99, "gcomp_shard_step_duration_seconds"), "p99")],
            "From a chunk-step's first push to its result, including the wait for the slowest "
            "worker.", unit="s")
    d.panel("Step phases p99",
            [(quantile(0.99, "gcomp_shard_step_phase_seconds", "phase"), "{{phase}}")],
            "straggler_wait: first to last push; decode, reduce, encode: the shard's own work. "
            "A large straggler_wait points at a slow worker, not at the shard.", unit="s")
    d.panel("Worker push-pull p50 / p99",
            [(quantile(0.5, "gcomp_worker_push_pull_seconds"), "p50"),
             (quantile(0.99, "gcomp_worker_push_pull_seconds"), "p99")],
            "One tensor's push-pull as the workers see it (only workers with a metrics port).",
            unit="s")
    d.panel("Worker retries/s",
            [("sum by (worker) (%s)" % rate("gcomp_worker_retries_total"), "worker {{worker}}")],
            "UNAVAILABLE calls retried by workers (shard restarts, lost connections).")

    d.row("Errors and load")
    d.panel("Pushes by status code",
            [("sum by (code) (%s)" % rate("gcomp_shard_pushes_total"), "{{code}}"),
             ("sum(%s)" % rate("gcomp_shard_duplicate_pushes_total"), "duplicates (retried pushes)")],
            "Anything but OK is an error a worker saw; docs/SERVICE.md lists what each code "
            "means.")
    d.panel("Limit refusals/s",
            [("sum by (shard) (%s)" % rate("gcomp_shard_limit_refusals_total"), "shard {{shard}}"),
             ("sum by (shard) (%s)" % rate("gcomp_shard_unread_replies_cancelled_total"),
              "unread replies cancelled, shard {{shard}}"),
             ("sum by (shard) (%s)" % rate("gcomp_shard_stream_limit_closures_total"),
              "connections over the stream limit, shard {{shard}}"),
             ("sum by (shard) (%s)" % rate("gcomp_shard_refused_address_connections_total"),
              "connections of refused addresses, shard {{shard}}")],
            "Requests refused by a shard's limits (memory budget, pending steps or bytes, "
            "tensors) with RESOURCE_EXHAUSTED, calls cancelled because their client left "
            "the replies unread, connections closed for holding more HTTP/2 streams open than "
            "allowed, and new connections of an address refused after that (docs/SERVICE.md, "
            "Limits).")
    d.panel("Memory used vs budget",
            [("gcomp_shard_memory_used_bytes{%s}" % SEL, "used, shard {{shard}}"),
             ("gcomp_shard_memory_budget_bytes{%s}" % SEL, "budget, shard {{shard}}")],
            "What each shard has reserved against its budget (limits.memory_budget_bytes).",
            unit="bytes")
    d.panel("Pending steps",
            [("gcomp_shard_pending_steps{%s}" % SEL, "shard {{shard}}")],
            "Chunk-steps with pushes but no result yet (bounded by limits.max_pending_steps).")
    d.panel("gRPC calls in flight",
            [("sum by (method) (gcomp_grpc_calls_in_flight{%s})" % SEL, "{{method}}")],
            "Calls being served now, all shards.")
    d.panel("Tensors and chunks by shard",
            [("gcomp_shard_tensors{%s}" % SEL, "tensors, shard {{shard}}"),
             ("gcomp_shard_chunks_owned{%s}" % SEL, "chunks, shard {{shard}}")],
            "Declared tensors, and the chunks each shard owns (they should be spread evenly).")

    return {
        "title": "gcomp-ps",
        "uid": "gcomp-ps",
        "description": "Shards and workers of gcomp-ps (docs/OPERATIONS.md).",
        "tags": ["gcomp"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "utc",
        "annotations": {"list": []},
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            {"name": "job", "label": "Job", "type": "query", "datasource": DS,
             "query": {"query": "label_values(gcomp_shard_map_epoch, gcomp_job)", "refId": "job"},
             "definition": "label_values(gcomp_shard_map_epoch, gcomp_job)", "refresh": 2,
             "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "hide": 0,
             "sort": 1},
        ]},
        "panels": d.panels,
    }


def render():
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gcomp-dashboard.json")
    with open(path, "w") as f:
        f.write(render())
    print(path)

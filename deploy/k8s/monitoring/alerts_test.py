"""The alerting rules (gcomp-alerts.rules.yaml, and the same groups in prometheusrule.yaml):
every series they read is one gcomp_server exports, every alert has a promtool unit test
(alerts_test.yaml) and a runbook entry, and `promtool test rules` passes, and fails on
rules with a changed threshold.

    /usr/bin/python3 -m pytest -q deploy/k8s/monitoring/alerts_test.py
"""
import os
import re
import shutil
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
RULES = os.path.join(HERE, "gcomp-alerts.rules.yaml")
TESTS = os.path.join(HERE, "alerts_test.yaml")


def rules():
    return [r for g in yaml.safe_load(open(RULES))["groups"] for r in g["rules"]]


def promtool():
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (apt-get install prometheus): "
                    "the alerting rules are not tested")
    return path


def test_the_prometheus_rule_carries_the_rules_file():
    pr = yaml.safe_load(open(os.path.join(HERE, "prometheusrule.yaml")))
    assert pr["kind"] == "PrometheusRule"
    assert pr["spec"]["groups"] == yaml.safe_load(open(RULES))["groups"]


def exported_metrics():
    """Names gcomp_server registers (server/shard_metrics.cc), histograms with their
    _bucket, _sum and _count series."""
    src = open(os.path.join(ROOT, "server", "shard_metrics.cc")).read()
    names = set(re.findall(r'\.Name\("([a-z_]+)"\)', src))
    assert len(names) > 20, names  # the file still registers metrics this way
    return names | {n + s for n in names for s in ("_bucket", "_sum", "_count")}


def test_every_series_an_alert_reads_is_exported():
    exported = exported_metrics()
    for r in rules():
        # Metric names: words outside grouping clauses (where gcomp_job is a label).
        bare = re.sub(r"\b(by|on|without|ignoring)\s*\([^)]*\)", "", r["expr"])
        used = set(re.findall(r"\b(gcomp_[a-z_]+)", bare))
        assert used <= exported, (r["alert"], used - exported)
        # Besides gcomp's own series only Prometheus's `up` of the ServiceMonitor's jobs,
        # and etcd's leader gauge (etcd 3.4 exports it on its metrics port).
        others = set(re.findall(r"\b([a-z_]+)\s*[{\[]", r["expr"])) - used
        assert others <= {"up", "etcd_server_has_leader"}, (r["alert"], others)


def test_every_alert_is_unit_tested_and_has_a_runbook_entry():
    tested = {t["alertname"] for case in yaml.safe_load(open(TESTS))["tests"]
              for t in case["alert_rule_test"]}
    runbook = open(os.path.join(ROOT, "docs", "DEPLOY.md")).read()
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)) == 9
    for name in names:
        assert name in tested, name
        assert "`%s`" % name in runbook, name + " has no entry in docs/DEPLOY.md"


def test_the_checkpoint_alert_counts_three_of_the_configs_intervals():
    """The interval comes from the shards (their config's every_steps), not a number here."""
    (r,) = [r for r in rules() if r["alert"] == "GcompCheckpointOverdue"]
    assert "> 3 * gcomp_shard_checkpoint_every_steps" in r["expr"], r["expr"]
    assert "gcomp_shard_checkpoint_every_steps > 0" in r["expr"], r["expr"]


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    tool = promtool()
    r = subprocess.run([tool, "check", "rules", RULES], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([tool, "test", "rules", TESTS], capture_output=True, text=True,
                       timeout=120, cwd=HERE)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout


@pytest.mark.parametrize("old,new,alert", [
    ("> 0.9", "> 0.99", "GcompShardMemoryNearBudget"),
    ("> 3 * gcomp_shard_checkpoint_every_steps", "> 30 * gcomp_shard_checkpoint_every_steps",
     "GcompCheckpointOverdue"),
    ("for: 30m", "for: 60m", "GcompReshardStuck"),
    ("[10m]", "[1h]", "GcompChunksLost"),
])
def test_the_unit_tests_fail_on_changed_rules(tmp_path, old, new, alert):
    tool = promtool()
    text = open(RULES).read()
    assert old in text
    (tmp_path / "gcomp-alerts.rules.yaml").write_text(text.replace(old, new, 1))
    shutil.copy(TESTS, tmp_path / "alerts_test.yaml")
    r = subprocess.run([tool, "test", "rules", "alerts_test.yaml"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0, r.stdout
    assert "alertname: %s" % alert in r.stdout + r.stderr, r.stdout + r.stderr

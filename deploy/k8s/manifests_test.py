"""The Kubernetes manifests of deploy/k8s/base: valid against the Kubernetes API schema
(offline, with the npm package kubernetes-models), consistent with each other, and with a
cluster config that gcomp itself accepts.

    /usr/bin/python3 -m pytest -q deploy/k8s
"""
import glob
import os
import shutil
import subprocess

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE = os.path.join(HERE, "base")
FILES = sorted(glob.glob(os.path.join(BASE, "*.yaml")))


def docs():
    out = {}
    for f in FILES:
        for d in yaml.safe_load_all(open(f)):
            if d:
                out[d["kind"]] = d
    return out


@pytest.fixture(scope="module")
def node_modules():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the schema check (apt-get install nodejs npm)")
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "gcomp-k8s-validate")
    os.makedirs(cache, exist_ok=True)
    if not os.path.isdir(os.path.join(cache, "node_modules", "kubernetes-models")):
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                            "--prefix", cache, "kubernetes-models@5", "js-yaml@4"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip("npm could not install kubernetes-models: " + r.stderr[-500:])
    return os.path.join(cache, "node_modules")


def validate(node_modules, files):
    return subprocess.run(["node", os.path.join(HERE, "validate.mjs"), *files],
                          env=dict(os.environ, NODE_PATH=node_modules),
                          capture_output=True, text=True, timeout=120)


def test_every_manifest_is_valid_against_the_kubernetes_schema(node_modules):
    r = validate(node_modules, FILES)
    assert r.returncode == 0, r.stdout + r.stderr
    checked = [l for l in r.stdout.splitlines() if l.startswith("ok ")]
    assert len(checked) == len(FILES) - 1, r.stdout  # all but the kustomization


def test_the_validator_rejects_a_broken_manifest(node_modules, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(os.path.join(BASE, "statefulset.yaml")).read()
                   .replace("replicas: 3", "replicas: three"))
    r = validate(node_modules, [str(bad)])
    assert r.returncode == 1 and "replicas must be integer" in r.stdout, r.stdout


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load(open(os.path.join(BASE, "kustomization.yaml")))
    listed = set(k["resources"])
    present = {os.path.basename(f) for f in FILES} - {"kustomization.yaml"}
    assert listed == present


def test_shards_agree_with_the_config_and_run_safely():
    d = docs()
    sts, svc, cm = d["StatefulSet"], d["Service"], d["ConfigMap"]
    config = yaml.safe_load(cm["data"]["cluster.yaml"])
    assert config["shards"]["count"] == sts["spec"]["replicas"]
    assert config["shards"]["address"] == "%s-{index}.%s:7000" % (sts["metadata"]["name"],
                                                                 svc["metadata"]["name"])
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert "--shard_from_hostname" in args and "--listen=0.0.0.0:7000" in args
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 7000
    grace_ms = int([a for a in args if a.startswith("--shutdown_grace_ms=")][0].split("=")[1])
    assert pod["terminationGracePeriodSeconds"] >= grace_ms / 1000 + 30
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert "subPath" not in mounts["config"]  # a subPath mount never sees ConfigMap updates
    assert mounts["checkpoints"]["mountPath"] == config["checkpoint"]["dir"]


def test_the_config_is_one_gcomp_accepts(tmp_path):
    admin = os.path.join(ROOT, "bazel-bin", "admin", "gcomp_admin")
    if not os.access(admin, os.X_OK):
        pytest.skip("bazel build //admin:gcomp_admin first")
    path = tmp_path / "cluster.yaml"
    path.write_text(docs()["ConfigMap"]["data"]["cluster.yaml"])
    # Exit 1: parsed and validated, the shards just are not there; 2 would be a bad config.
    r = subprocess.run([admin, "status", "--config", str(path), "--timeout_ms", "200"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gcomp-shard-2.gcomp-shard:7000" in r.stdout

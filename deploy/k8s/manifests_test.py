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


# The mTLS overlay (deploy/k8s/overlays/mtls): rendered here as kustomize would, by applying
# its strategic-merge patches to the base, then checked like the base.
MTLS = os.path.join(HERE, "overlays", "mtls")
# Strategic-merge keys of the lists the overlay patches (Kubernetes' patchMergeKey).
MERGE_KEYS = {"containers": "name", "volumes": "name", "volumeMounts": "mountPath",
              "ports": "containerPort"}


def strategic_merge(base, patch, key=None):
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = strategic_merge(base[k], v, k) if k in base else v
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        mk = MERGE_KEYS[key]
        out = list(base)
        for item in patch:
            at = [i for i, b in enumerate(out) if b.get(mk) == item.get(mk)]
            if at:
                out[at[0]] = strategic_merge(out[at[0]], item)
            else:
                out.append(item)
        return out
    return patch


def render_mtls():
    k = yaml.safe_load(open(os.path.join(MTLS, "kustomization.yaml")))
    assert k["resources"] == ["../../base"]
    rendered = {kind: d for kind, d in docs().items() if kind != "Kustomization"}
    for p in k["patches"]:
        patch = yaml.safe_load(open(os.path.join(MTLS, p["path"])))
        kind = patch["kind"]
        assert rendered[kind]["metadata"]["name"] == patch["metadata"]["name"], p
        rendered[kind] = strategic_merge(rendered[kind], patch)
    return rendered


def test_strategic_merge_merges_lists_by_key():
    base = {"containers": [{"name": "a", "ports": [{"containerPort": 1}]}]}
    patch = {"containers": [{"name": "a", "ports": [{"containerPort": 2}]}, {"name": "b"}]}
    assert strategic_merge(base, patch) == {
        "containers": [{"name": "a", "ports": [{"containerPort": 1}, {"containerPort": 2}]},
                       {"name": "b"}]}


def test_mtls_overlay_renders_valid_manifests(node_modules, tmp_path):
    files = []
    for kind, doc in render_mtls().items():
        f = tmp_path / (kind + ".yaml")
        f.write_text(yaml.safe_dump(doc))
        files.append(str(f))
    r = validate(node_modules, files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len([l for l in r.stdout.splitlines() if l.startswith("ok ")]) == len(files)


def test_mtls_overlay_mounts_what_its_config_reads_and_probes_the_health_port():
    d = render_mtls()
    config = yaml.safe_load(d["ConfigMap"]["data"]["cluster.yaml"])
    base = yaml.safe_load(docs()["ConfigMap"]["data"]["cluster.yaml"])
    security = config.pop("security")
    assert config == base  # the overlay's config is the base's plus its security section
    pod = d["StatefulSet"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"tls": "gcomp-tls", "token": "gcomp-job-token"}
    for name in secrets:
        assert mounts[name]["readOnly"] is True
        assert "subPath" not in mounts[name]  # a subPath mount never sees Secret updates
    for field, volume, key in (("ca_file", "tls", "ca.crt"), ("cert_file", "tls", "tls.crt"),
                               ("key_file", "tls", "tls.key"),
                               ("token_file", "token", "token")):
        assert security[field] == mounts[volume]["mountPath"] + "/" + key, field
    port = security["health_port"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == port
    assert port in [p["containerPort"] for p in c["ports"]]
    # The rest of the base's pod is kept: config and checkpoint mounts, non-root.
    assert {"config", "checkpoints"} <= set(mounts)
    assert pod["securityContext"]["runAsUser"] == 10001


def test_the_mtls_config_is_one_gcomp_accepts(tmp_path):
    admin = os.path.join(ROOT, "bazel-bin", "admin", "gcomp_admin")
    if not os.access(admin, os.X_OK):
        pytest.skip("bazel build //admin:gcomp_admin first")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    pki = tmp_path / "pki"
    subprocess.run([os.path.join(ROOT, "tools", "make_test_certs.sh"), str(pki)], check=True,
                   capture_output=True, timeout=120)
    text = render_mtls()["ConfigMap"]["data"]["cluster.yaml"]
    for mounted, made in (("/etc/gcomp-tls/ca.crt", "ca.pem"), ("/etc/gcomp-tls/tls.crt", "client.pem"),
                          ("/etc/gcomp-tls/tls.key", "client.key"),
                          ("/etc/gcomp-token/token", "token")):
        assert mounted in text
        text = text.replace(mounted, str(pki / made))
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    # Exit 1: the config and its files were read, the shards just are not there.
    r = subprocess.run([admin, "status", "--config", str(path), "--timeout_ms", "200"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "gcomp-shard-2.gcomp-shard:7000" in r.stdout


# The example training job (deploy/k8s/examples): an Indexed Job on the shards' ConfigMap.
EXAMPLES = os.path.join(HERE, "examples")
EXAMPLE_FILES = sorted(glob.glob(os.path.join(EXAMPLES, "*.yaml")))


def example_docs():
    return {d["kind"]: d for f in EXAMPLE_FILES for d in yaml.safe_load_all(open(f)) if d}


def test_example_job_manifests_are_valid_and_listed(node_modules):
    r = validate(node_modules, EXAMPLE_FILES)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len([l for l in r.stdout.splitlines() if l.startswith("ok ")]) == 2, r.stdout
    k = yaml.safe_load(open(os.path.join(EXAMPLES, "kustomization.yaml")))
    assert set(k["resources"]) == {os.path.basename(f) for f in EXAMPLE_FILES} - {
        "kustomization.yaml"}


def test_example_job_matches_the_config_it_trains_on():
    d, base = example_docs(), docs()
    job, svc = d["Job"], d["Service"]
    config = yaml.safe_load(base["ConfigMap"]["data"]["cluster.yaml"])
    spec = job["spec"]
    # Every worker at once, one pod per worker index; a failed worker fails the job.
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == config["workers"]
    assert spec["backoffLimit"] == 0
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    (c,) = pod["containers"]
    master = [a for a in c["args"] if a.startswith("--master=")][0].split("=", 1)[1]
    assert master == "%s-0.%s:%d" % (job["metadata"]["name"], svc["metadata"]["name"],
                                     svc["spec"]["ports"][0]["port"])
    assert "--cluster-config=/etc/gcomp/cluster.yaml" in c["args"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/gcomp"
    config_volume = [v for v in pod["volumes"] if v["name"] == "config"][0]
    assert config_volume["configMap"]["name"] == base["ConfigMap"]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}

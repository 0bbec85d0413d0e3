"""The Kubernetes manifests of deploy/k8s/base: valid against the Kubernetes API schema
(offline, with the npm package kubernetes-models), consistent with each other (shards, etcd
members, the config's addresses, NetworkPolicies), and with a cluster config that gcomp
itself accepts; the monitoring component likewise.

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
MONITORING = os.path.join(HERE, "monitoring")
FILES = sorted(glob.glob(os.path.join(BASE, "*.yaml")))


def docs():
    """Base's objects by "Kind/name" (there are two StatefulSets, Services, ...)."""
    out = {}
    for f in FILES:
        for d in yaml.safe_load_all(open(f)):
            if d and d["kind"] != "Kustomization":
                key = "%s/%s" % (d["kind"], d["metadata"]["name"])
                assert key not in out, key
                out[key] = d
    return out


def base_config():
    return yaml.safe_load(docs()["ConfigMap/gcomp-config"]["data"]["cluster.yaml"])


@pytest.fixture(scope="module")
def node_modules():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for the schema check (apt-get install nodejs npm)")
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                         "gcomp-k8s-validate")
    os.makedirs(cache, exist_ok=True)
    if not all(os.path.isdir(os.path.join(cache, "node_modules", p)) for p in
               ("kubernetes-models", "js-yaml", "@kubernetes-models/prometheus-operator")):
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                            "--prefix", cache, "kubernetes-models@5", "js-yaml@4",
                            "@kubernetes-models/prometheus-operator@6"],
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
    assert len(checked) == len(docs()), r.stdout  # every object; the kustomization is skipped


# One broken field per schema the validator loads: Kubernetes' own and the Prometheus
# operator's.
@pytest.mark.parametrize("path,good,broken,complaint", [
    (os.path.join(BASE, "statefulset.yaml"), "replicas: 3", "replicas: three",
     "replicas must be integer"),
    (os.path.join(MONITORING, "prometheusrule.yaml"), "for: 5m", "for: 5 minutes",
     "for must match pattern"),
])
def test_the_validator_rejects_a_broken_manifest(node_modules, tmp_path, path, good, broken,
                                                 complaint):
    bad = tmp_path / "bad.yaml"
    text = open(path).read()
    assert good in text
    bad.write_text(text.replace(good, broken))
    r = validate(node_modules, [str(bad)])
    assert r.returncode == 1 and complaint in r.stdout, r.stdout


def test_kustomization_lists_every_manifest():
    k = yaml.safe_load(open(os.path.join(BASE, "kustomization.yaml")))
    listed = set(k["resources"])
    present = {os.path.basename(f) for f in FILES} - {"kustomization.yaml"}
    assert listed == present


def test_shards_agree_with_the_config_and_run_safely():
    d = docs()
    sts, svc = d["StatefulSet/gcomp-shard"], d["Service/gcomp-shard"]
    config = base_config()
    assert config["shards"]["count"] == sts["spec"]["replicas"]
    assert config["shards"]["address"] == "%s-{index}.%s:7000" % (sts["metadata"]["name"],
                                                                 svc["metadata"]["name"])
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = c["args"]
    assert "--shard_from_hostname" in args and "--listen=0.0.0.0:7000" in args
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == 7000
    # Readiness: whether the shard serves training calls; liveness: the process only.
    assert c["readinessProbe"]["grpc"]["service"] == "gcomp.proto.Aggregation"
    assert "service" not in c["livenessProbe"]["grpc"]
    # A shard listens only after its restore: the startup probe lets that take 30 minutes
    # before liveness counts (liveness alone restarted a long restore after 90 s).
    startup = c["startupProbe"]
    assert "service" not in startup["grpc"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    assert "initialDelaySeconds" not in c["livenessProbe"]
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
    path.write_text(docs()["ConfigMap/gcomp-config"]["data"]["cluster.yaml"])
    # Exit 1: parsed and validated, the shards (and etcd) just are not there; 2 would be a
    # bad config.
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
    rendered = docs()
    for p in k["patches"]:
        patch = yaml.safe_load(open(os.path.join(MTLS, p["path"])))
        key = "%s/%s" % (patch["kind"], patch["metadata"]["name"])
        assert key in rendered, p
        rendered[key] = strategic_merge(rendered[key], patch)
    return rendered


def test_strategic_merge_merges_lists_by_key():
    base = {"containers": [{"name": "a", "ports": [{"containerPort": 1}]}]}
    patch = {"containers": [{"name": "a", "ports": [{"containerPort": 2}]}, {"name": "b"}]}
    assert strategic_merge(base, patch) == {
        "containers": [{"name": "a", "ports": [{"containerPort": 1}, {"containerPort": 2}]},
                       {"name": "b"}]}


def test_mtls_overlay_renders_valid_manifests(node_modules, tmp_path):
    files = []
    for key, doc in render_mtls().items():
        f = tmp_path / (key.replace("/", "-") + ".yaml")
        f.write_text(yaml.safe_dump(doc))
        files.append(str(f))
    r = validate(node_modules, files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert len([l for l in r.stdout.splitlines() if l.startswith("ok ")]) == len(files)


def test_mtls_overlay_mounts_what_its_config_reads_and_probes_the_health_port():
    d = render_mtls()
    config = yaml.safe_load(d["ConfigMap/gcomp-config"]["data"]["cluster.yaml"])
    security = config.pop("security")
    assert config == base_config()  # the overlay's config is the base's plus its security
    pod = d["StatefulSet/gcomp-shard"]["spec"]["template"]["spec"]
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
    for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == port
    assert c["readinessProbe"]["grpc"]["service"] == "gcomp.proto.Aggregation"  # kept by the patch
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
    text = render_mtls()["ConfigMap/gcomp-config"]["data"]["cluster.yaml"]
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
    config = base_config()
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
    assert config_volume["configMap"]["name"] == base["ConfigMap/gcomp-config"]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}


def test_mtls_example_job_mounts_what_the_mtls_config_reads(node_modules, tmp_path):
    here = os.path.join(HERE, "overlays", "train-mtls")
    k = yaml.safe_load(open(os.path.join(here, "kustomization.yaml")))
    assert k["resources"] == ["../../examples"]
    job = example_docs()["Job"]
    for p in k["patches"]:
        patch = yaml.safe_load(open(os.path.join(here, p["path"])))
        assert (patch["kind"], patch["metadata"]["name"]) == (job["kind"], job["metadata"]["name"])
        job = strategic_merge(job, patch)
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    r = validate(node_modules, [str(f)])
    assert r.returncode == 0, r.stdout + r.stderr
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
    # Its own certificate, never the shards' key; the shards' job token.
    assert {n: s["secretName"] for n, s in secrets.items()} == {"tls": "gcomp-worker-tls",
                                                               "token": "gcomp-job-token"}
    security = yaml.safe_load(render_mtls()["ConfigMap/gcomp-config"]["data"]["cluster.yaml"])[
        "security"]
    for field, volume, key in (("ca_file", "tls", "ca.crt"), ("cert_file", "tls", "tls.crt"),
                               ("key_file", "tls", "tls.key"), ("token_file", "token", "token")):
        assert security[field] == mounts[volume]["mountPath"] + "/" + key, field
    for name, secret in secrets.items():
        assert mounts[name]["readOnly"] is True and "subPath" not in mounts[name]
        assert secret["defaultMode"] == 0o440
    # The worker (uid 10001) reads the 0440 files through the pod's fsGroup.
    assert pod["securityContext"]["fsGroup"] == c.get("securityContext", {}).get(
        "runAsGroup", pod["securityContext"]["runAsGroup"])
    assert pod["securityContext"]["runAsNonRoot"]  # the base Job's settings are kept
    assert "config" in mounts and "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}


# The etcd members, the security defaults and the NetworkPolicies of base.
def selects(selector, labels):
    """Whether a label selector (matchLabels / matchExpressions In) selects `labels`."""
    for k, v in selector.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e  # the only operator used here
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


def test_selects_matches_labels_and_expressions():
    assert selects({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"})
    assert not selects({"matchLabels": {"a": "1"}}, {"a": "2"})
    assert selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]},
                   {"a": "2"})
    assert not selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]},
                       {})


def flag(args, name):
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith("--%s=" % name)]
    return value


def port_of(url):
    return int(url.rsplit(":", 1)[1])


def test_the_config_names_every_etcd_member_by_its_stable_dns_name():
    d = docs()
    sts, svc = d["StatefulSet/gcomp-etcd"], d["Service/gcomp-etcd"]
    config = base_config()
    n = sts["spec"]["replicas"]
    assert n >= 3 and n % 2 == 1  # a quorum survives one lost member
    assert config["replicas"] == 2  # failover, which is what etcd is here for
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    client_port = port_of(flag(args, "listen-client-urls"))
    peer_port = port_of(flag(args, "listen-peer-urls"))
    names = ["%s-%d.%s" % (sts["metadata"]["name"], k, svc["metadata"]["name"]) for k in range(n)]
    assert config["coordination"]["etcd"] == ["%s:%d" % (h, client_port) for h in names]
    assert 1000 <= config["coordination"]["lease_ttl_ms"]
    assert config["coordination"]["request_timeout_ms"] <= config["coordination"]["lease_ttl_ms"] / 3
    # Member K is named after its pod and advertises the pod's stable name.
    assert flag(args, "name") == "$(POD_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert flag(args, "advertise-client-urls") == "http://$(POD_NAME).%s:%d" % (
        svc["metadata"]["name"], client_port)
    assert flag(args, "initial-advertise-peer-urls") == "http://$(POD_NAME).%s:%d" % (
        svc["metadata"]["name"], peer_port)
    initial = dict(m.split("=", 1) for m in flag(args, "initial-cluster").split(","))
    assert initial == {"%s-%d" % (sts["metadata"]["name"], k): "http://%s:%d" % (names[k], peer_port)
                       for k in range(n)}
    assert flag(args, "initial-cluster-state") == "new"
    # docs/DEPLOY.md ("Day 2: etcd") patches this argument by its index.
    assert args[9] == "--initial-cluster-state=new"
    # The headless Service publishes members before they are Ready (quorum needs peers).
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": svc["spec"]["selector"]}, labels)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert (ports["client"], ports["peer"]) == (client_port, peer_port)
    assert {p["port"] for p in svc["spec"]["ports"]} >= {client_port, peer_port}
    # Probes on /health of the metrics listener.
    metrics_port = port_of(flag(args, "listen-metrics-urls"))
    assert ports["metrics"] == metrics_port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
        assert c[probe]["httpGet"]["port"] in ("metrics", metrics_port)
    # Each member's data on a volume of its own, under the data directory.
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    assert flag(args, "data-dir").startswith(mount["mountPath"] + "/")
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    k = yaml.safe_load(open(os.path.join(BASE, "kustomization.yaml")))
    assert c["image"] in {i["name"] for i in k["images"]}


def test_the_pod_disruption_budgets_take_one_pod_at_a_time():
    d = docs()
    for name in ("gcomp-shard", "gcomp-etcd"):
        pdb = d["PodDisruptionBudget/" + name]
        assert pdb["spec"]["maxUnavailable"] == 1
        assert selects(pdb["spec"]["selector"],
                       d["StatefulSet/" + name]["spec"]["template"]["metadata"]["labels"])


def pod_specs():
    """Every pod template: base's StatefulSets, the mTLS overlay's and the example Job."""
    out = {}
    for source, objs in (("base", docs()), ("mtls", render_mtls())):
        for key, d in objs.items():
            if key.startswith("StatefulSet/"):
                out["%s %s" % (source, key)] = d["spec"]["template"]
    out["example Job"] = example_docs()["Job"]["spec"]["template"]
    return out


def test_no_pod_mounts_a_service_account_token_and_pods_spread_over_nodes():
    specs = pod_specs()
    assert len(specs) == 5, sorted(specs)
    for where, template in specs.items():
        pod = template["spec"]
        assert pod.get("automountServiceAccountToken") is False, where
        if where.startswith(("base", "mtls")):
            (spread,) = pod["topologySpreadConstraints"]
            assert spread["topologyKey"] == "kubernetes.io/hostname", where
            assert spread["maxSkew"] == 1, where
            assert selects(spread["labelSelector"], template["metadata"]["labels"]), where


def ingress_from(policy, port):
    """The `from` peers of the rules that admit `port`."""
    peers = []
    for rule in policy["spec"]["ingress"]:
        if port in [p["port"] for p in rule["ports"]]:
            peers += rule["from"]
    return peers


def admitted(peers, labels, same_namespace=True):
    return any(selects(p.get("podSelector", {}), labels) and
               ("namespaceSelector" in p or same_namespace) for p in peers)


def test_network_policies_admit_workers_peers_prometheus_and_nothing_else():
    d = docs()
    shard_labels = d["StatefulSet/gcomp-shard"]["spec"]["template"]["metadata"]["labels"]
    etcd_labels = d["StatefulSet/gcomp-etcd"]["spec"]["template"]["metadata"]["labels"]
    worker_labels = example_docs()["Job"]["spec"]["template"]["metadata"]["labels"]
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    shard_c = d["StatefulSet/gcomp-shard"]["spec"]["template"]["spec"]["containers"][0]
    shard_ports = {p["name"]: p["containerPort"] for p in shard_c["ports"]}
    etcd_c = d["StatefulSet/gcomp-etcd"]["spec"]["template"]["spec"]["containers"][0]
    etcd_ports = {p["name"]: p["containerPort"] for p in etcd_c["ports"]}

    shard = d["NetworkPolicy/gcomp-shard"]
    assert selects(shard["spec"]["podSelector"], shard_labels)
    assert shard["spec"]["policyTypes"] == ["Ingress"]
    grpc = ingress_from(shard, shard_ports["grpc"])
    assert admitted(grpc, worker_labels) and admitted(grpc, shard_labels)
    assert not admitted(grpc, {"app.kubernetes.io/name": "other"})
    assert not admitted(grpc, prometheus)
    metrics = ingress_from(shard, shard_ports["metrics"])
    assert admitted(metrics, prometheus, same_namespace=False)
    assert not admitted(metrics, worker_labels)
    # Nothing else is open on the shards.
    assert {p["port"] for r in shard["spec"]["ingress"] for p in r["ports"]} == {
        shard_ports["grpc"], shard_ports["metrics"]}

    etcd = d["NetworkPolicy/gcomp-etcd"]
    assert selects(etcd["spec"]["podSelector"], etcd_labels)
    assert not selects(etcd["spec"]["podSelector"], shard_labels)
    client = ingress_from(etcd, etcd_ports["client"])
    assert admitted(client, shard_labels) and not admitted(client, worker_labels)
    assert not admitted(client, etcd_labels)
    peer = ingress_from(etcd, etcd_ports["peer"])
    assert admitted(peer, etcd_labels) and not admitted(peer, shard_labels)
    assert admitted(ingress_from(etcd, etcd_ports["metrics"]), prometheus, same_namespace=False)


# The monitoring component (deploy/k8s/monitoring) and the overlay that adds it to base.


def test_monitoring_component_lists_its_objects_and_they_are_valid(node_modules):
    k = yaml.safe_load(open(os.path.join(MONITORING, "kustomization.yaml")))
    assert k["kind"] == "Component"
    files = [os.path.join(MONITORING, f) for f in k["resources"]]
    kinds = {d["kind"] for f in files for d in yaml.safe_load_all(open(f)) if d}
    assert kinds == {"Service", "ServiceMonitor", "PrometheusRule"}
    r = validate(node_modules, files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok   " + os.path.join(MONITORING, "prometheusrule.yaml") in r.stdout, r.stdout
    overlay = yaml.safe_load(open(os.path.join(HERE, "overlays", "monitoring",
                                               "kustomization.yaml")))
    assert overlay["resources"] == ["../../base"] and overlay["components"] == ["../../monitoring"]


def test_kustomize_renders_base_and_every_overlay(node_modules, tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (its built-in kustomize renders offline) is not installed")
    base = set(docs())
    monitoring = {"%s/%s" % (d["kind"], d["metadata"]["name"])
                  for f in ("servicemonitor.yaml", "prometheusrule.yaml")
                  for d in yaml.safe_load_all(open(os.path.join(MONITORING, f))) if d}
    examples = {"%s/%s" % (d["kind"], d["metadata"]["name"]) for d in example_docs().values()
                if d["kind"] != "Kustomization"}
    for path, want in (("base", base), ("overlays/mtls", base),
                       ("overlays/monitoring", base | monitoring), ("overlays/train-mtls", examples)):
        r = subprocess.run([kubectl, "kustomize", os.path.join(HERE, path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, path + ": " + r.stderr
        objs = [o for o in yaml.safe_load_all(r.stdout) if o]
        assert {"%s/%s" % (o["kind"], o["metadata"]["name"]) for o in objs} == want, path
        assert len(objs) == len(want), path
        f = tmp_path / (path.replace("/", "-") + ".yaml")
        f.write_text(r.stdout)
        v = validate(node_modules, [str(f)])
        assert v.returncode == 0, path + ": " + v.stdout

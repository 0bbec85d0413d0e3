"""The shard manifests of deploy/k8s/base run for real: the runtime image built from
deploy/image/Containerfile, each StatefulSet ordinal rendered as a Pod with the
template's image, args, probes, security context and volumes (podman 4.3 plays Pods and
ConfigMaps, not StatefulSets), played with `podman kube play` on a network of the test's
own; worker pods replay a gradient through them.

    /usr/bin/python3 -m pytest -q deploy/k8s/play_test.py

The changes to the manifests: pod DNS names (gcomp-shard-K.gcomp-shard) need a cluster
DNS, so the test gives the pods fixed addresses on its network and sets the ConfigMap's
address template to them; and the containers' `ports` (informational in Kubernetes) are
left out, since podman 4.3 would publish them on the host. Needs what deploy/image/image_test.py needs, plus catatonit.
"""
import copy
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE = os.path.join(HERE, "base")
TAG = "localhost/gcomp:play-test"
NETWORK = "gcomp-play-test"
SUBNET = "10.89.71"  # the test's own network; nothing else is addressed
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = \"cgroupfs\"\n"


def manifests():
    out = {}
    for name in ("configmap.yaml", "statefulset.yaml"):
        for d in yaml.safe_load_all(open(os.path.join(BASE, name))):
            out[d["kind"]] = d
    return out


def shard_pods(replicas, image):
    """Each ordinal of the StatefulSet as a Pod: the same template, named as the
    StatefulSet names its pods."""
    m = manifests()
    sts = m["StatefulSet"]
    pods = []
    for k in range(replicas):
        spec = copy.deepcopy(sts["spec"]["template"]["spec"])
        for c in spec["containers"]:
            c["image"] = image
            # Informational in Kubernetes; podman 4.3 would publish them on the host, where
            # three pods cannot all have port 7000.
            c.pop("ports", None)
        # The shared checkpoint claim becomes a podman volume; nothing else changes.
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "%s-%d" % (sts["metadata"]["name"], k),
                                  "labels": sts["spec"]["template"]["metadata"]["labels"]},
                     "spec": spec})
    return pods


def podman(env, *args, timeout=300, check=False):
    r = subprocess.run(["podman", "--runtime", "runc", *args], env=env, capture_output=True,
                       text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, " ".join(args) + ": " + r.stdout[-2000:] + r.stderr[-2000:]
    return r


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("needs root for podman")
    for tool in ("podman", "runc", "debootstrap", "catatonit", "bazel"):
        if shutil.which(tool) is None and not os.path.exists("/usr/libexec/podman/" + tool):
            pytest.skip("%s is not installed (tools/bootstrap.sh installs it)" % tool)
    tmp = tmp_path_factory.mktemp("play")
    (tmp / "containers.conf").write_text(CONTAINERS_CONF)
    e = dict(os.environ, CONTAINERS_CONF=str(tmp / "containers.conf"),
             PODMAN="podman --runtime runc", BAZEL_FLAGS="")
    build = subprocess.run([os.path.join(ROOT, "deploy", "image", "build.sh"), "--tag", TAG],
                           cwd=ROOT, env=e, capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    podman(e, "network", "rm", "-f", NETWORK)
    podman(e, "network", "create", "--subnet", SUBNET + ".0/24", NETWORK, check=True)
    yield e, tmp
    podman(e, "network", "rm", "-f", NETWORK)
    podman(e, "image", "rm", "-f", TAG)


def play(env, path, ips):
    args = ["kube", "play", "--network", NETWORK]
    for ip in ips:
        args += ["--ip", ip]
    return podman(env, *args, str(path), check=True)


def worker_pods(workers, steps, data_dir):
    pods = []
    for w in range(workers):
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "gcomp-worker-%d" % w},
                     "spec": {"restartPolicy": "Never",
                              "containers": [{
                                  "name": "worker", "image": TAG,
                                  "args": ["gcomp_worker", "--config=/etc/gcomp/cluster.yaml",
                                           "--worker=%d" % w, "--gradients=/data/g.npy",
                                           "--steps=%d" % steps, "--progress=never"],
                                  "volumeMounts": [{"name": "config", "mountPath": "/etc/gcomp"},
                                                   {"name": "data", "mountPath": "/data"}]}],
                              "volumes": [{"name": "config", "configMap": {"name": "gcomp-config"}},
                                          {"name": "data", "hostPath": {"path": str(data_dir)}}]}})
    return pods


def health(address):
    """grpc.health.v1.Health/Check for the whole server, as the kubelet's gRPC probe asks:
    the serialized response (b"\\x08\\x01" is SERVING), or None if it does not answer."""
    import grpc
    with grpc.insecure_channel(address) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            return check(b"", timeout=2, wait_for_ready=True)
        except grpc.RpcError:
            return None


def wait_exited(env, names, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        r = podman(env, "ps", "-a", "--format", "{{.Names}} {{.Status}}")
        states = dict(l.split(" ", 1) for l in r.stdout.splitlines() if l)
        if all(states.get(n, "").startswith("Exited") for n in names):
            return
        time.sleep(0.5)
    raise AssertionError("workers still running after %d s: %s" % (timeout_s, r.stdout))


def test_shard_pods_serve_worker_pods_and_a_deleted_shard_is_named(env):
    e, tmp = env
    shards, workers = 3, 2
    m = manifests()
    config = yaml.safe_load(m["ConfigMap"]["data"]["cluster.yaml"])
    config["workers"] = workers
    config["shards"] = {"count": shards, "address": SUBNET + ".1{index}:7000"}
    config["uplink"] = config["downlink"] = {"mode": "lossless"}
    config["step_timeout_ms"], config["rpc_timeout_ms"] = 3000, 6000
    config["max_retries"], config["connect_timeout_ms"] = 2, 20000
    cm = copy.deepcopy(m["ConfigMap"])
    cm["data"]["cluster.yaml"] = yaml.safe_dump(config)
    shard_yaml = tmp / "shards.yaml"
    shard_yaml.write_text(yaml.safe_dump_all([cm] + shard_pods(shards, TAG)))
    data = tmp / "data"
    data.mkdir()
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "write_npy.py"),
                    str(data / "g.npy"), "65536", "sine"], check=True)
    os.chmod(data, 0o755)
    os.chmod(data / "g.npy", 0o644)
    try:
        play(e, shard_yaml, [SUBNET + ".1%d" % k for k in range(shards)])
        # What the readiness and liveness probes ask: every shard pod answers SERVING.
        for k in range(shards):
            deadline = time.time() + 30
            while health("%s.1%d:7000" % (SUBNET, k)) != b"\x08\x01":
                assert time.time() < deadline, "shard pod %d never reported SERVING" % k
                time.sleep(0.2)
        # 1. Workers train through the shards: every result exact.
        run1 = tmp / "workers1.yaml"
        run1.write_text(yaml.safe_dump_all([cm] + worker_pods(workers, 20, data)))
        play(e, run1, [SUBNET + ".2%d" % w for w in range(workers)])
        names = ["gcomp-worker-%d-worker" % w for w in range(workers)]
        wait_exited(e, names, 120)
        outs = [podman(e, "logs", n).stdout for n in names]
        for out in outs:
            line = [l for l in out.splitlines() if l.startswith("{")][-1]
            result = json.loads(line)
            assert result["ok"] and result["steps"] == 20 and result["exact"], line
        podman(e, "kube", "down", str(run1), check=True)
        # 2. A shard pod deleted while workers train: the step fails, naming the shard.
        run2 = tmp / "workers2.yaml"
        run2.write_text(yaml.safe_dump_all([cm] + worker_pods(workers, 100000, data)))
        play(e, run2, [SUBNET + ".3%d" % w for w in range(workers)])
        time.sleep(3)
        podman(e, "pod", "rm", "-f", "-t", "0", "gcomp-shard-1", check=True)
        wait_exited(e, names, 120)
        for n in names:
            out = podman(e, "logs", n).stdout
            line = [l for l in out.splitlines() if l.startswith("{")][-1]
            result = json.loads(line)
            assert not result["ok"], line
            assert SUBNET + ".11:7000" in result["error"], line
        podman(e, "kube", "down", str(run2))
    finally:
        logs = {p: podman(e, "logs", "gcomp-shard-%d-shard" % p).stderr[-1500:] for p in range(shards)}
        podman(e, "kube", "down", str(shard_yaml))
        # kube down stops at a pod that is already gone (the one deleted above).
        for k in range(shards):
            podman(e, "pod", "rm", "-f", "-t", "0", "gcomp-shard-%d" % k)
        podman(e, "volume", "rm", "-f", "gcomp-checkpoints")
        print(json.dumps(logs, indent=1))

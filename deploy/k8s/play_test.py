"""The manifests of deploy/k8s run for real: the runtime image built from
deploy/image/Containerfile, each StatefulSet ordinal rendered as a Pod with the
template's image, args, probes, security context and volumes (podman 4.3 plays Pods and
ConfigMaps, not StatefulSets or Jobs), played with `podman kube play` on a network of the
test's own; worker pods replay a gradient through them. The example Job's pods (the
training image, deploy/image/Containerfile.train) train the digits example through the
shard pods, undisturbed, through a failover and through a re-shard; the mTLS overlay's
shard pods serve only workers with a certificate and the job token.

    /usr/bin/python3 -m pytest -q deploy/k8s/play_test.py

The changes to the manifests: pod DNS names (gcomp-shard-K.gcomp-shard) need a cluster
DNS, so the test gives the pods fixed addresses on its network and sets the ConfigMap's
address template to them; and the containers' `ports` (informational in Kubernetes) are
left out, since podman 4.3 would publish them on the host. The shards run without etcd
(`without_etcd`): base's etcd StatefulSet is not played. Needs what
deploy/image/image_test.py needs, plus catatonit.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BASE = os.path.join(HERE, "base")
EXAMPLES = os.path.join(HERE, "examples")
TAG = "localhost/gcomp:play-test"
TRAIN_TAG = "localhost/gcomp-train:play-test"
NETWORK = "gcomp-play-test"
SUBNET = "10.89.71"  # the test's own network; nothing else is addressed
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = \"cgroupfs\"\n"


def manifests():
    out = {}
    for name in ("configmap.yaml", "statefulset.yaml"):
        for d in yaml.safe_load_all(open(os.path.join(BASE, name))):
            out[d["kind"]] = d
    return out


def without_etcd(config):
    """The config with replicas: 1 and no coordination section: these pods play the shards
    only (base's etcd members are a StatefulSet of their own, not played here); the
    failover test sets replicas: 2 itself and runs the shards' peer protocol."""
    assert config.pop("coordination")["etcd"], "base's config names the etcd members"
    config["replicas"] = 1
    return config


def shard_pods(replicas, image, sts=None):
    """Each ordinal of the StatefulSet (base's, or `sts`) as a Pod: the same template, named
    as the StatefulSet names its pods."""
    sts = sts or manifests()["StatefulSet"]
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


def worker_pods(workers, steps, data_dir, mounts=(), name="gcomp-worker"):
    """gcomp_worker pods replaying data_dir/g.npy; `mounts`: (volume name, host directory,
    mount path) more."""
    pods = []
    for w in range(workers):
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "%s-%d" % (name, w)},
                     "spec": {"restartPolicy": "Never",
                              "containers": [{
                                  "name": "worker", "image": TAG,
                                  "args": ["gcomp_worker", "--config=/etc/gcomp/cluster.yaml",
                                           "--worker=%d" % w, "--gradients=/data/g.npy",
                                           "--steps=%d" % steps, "--progress=never"],
                                  "volumeMounts": [{"name": "config", "mountPath": "/etc/gcomp"},
                                                   {"name": "data", "mountPath": "/data"}] +
                                                  [{"name": v, "mountPath": m, "readOnly": True}
                                                   for v, _, m in mounts]}],
                              "volumes": [{"name": "config", "configMap": {"name": "gcomp-config"}},
                                          {"name": "data", "hostPath": {"path": str(data_dir)}}] +
                                         [{"name": v, "hostPath": {"path": str(d)}}
                                          for v, d, _ in mounts]}})
    return pods


def gradient_dir(path):
    """A directory the pods' uid can read, holding g.npy: a synthetic gradient of 65,536
    f32 elements for gcomp_worker to replay."""
    path.mkdir()
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "write_npy.py"),
                    str(path / "g.npy"), "65536", "sine"], check=True)
    os.chmod(path, 0o755)
    os.chmod(path / "g.npy", 0o644)
    return path


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


def wait_serving(address, what, timeout_s=30):
    deadline = time.time() + timeout_s
    while health(address) != b"\x08\x01":
        assert time.time() < deadline, "%s never reported SERVING" % what
        time.sleep(0.2)


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
    config = without_etcd(yaml.safe_load(m["ConfigMap"]["data"]["cluster.yaml"]))
    config["workers"] = workers
    config["shards"] = {"count": shards, "address": SUBNET + ".1{index}:7000"}
    config["uplink"] = config["downlink"] = {"mode": "lossless"}
    config["step_timeout_ms"], config["rpc_timeout_ms"] = 3000, 6000
    config["max_retries"], config["connect_timeout_ms"] = 2, 20000
    cm = copy.deepcopy(m["ConfigMap"])
    cm["data"]["cluster.yaml"] = yaml.safe_dump(config)
    shard_yaml = tmp / "shards.yaml"
    shard_yaml.write_text(yaml.safe_dump_all([cm] + shard_pods(shards, TAG)))
    data = gradient_dir(tmp / "data")
    try:
        play(e, shard_yaml, [SUBNET + ".1%d" % k for k in range(shards)])
        # What the readiness and liveness probes ask: every shard pod answers SERVING.
        for k in range(shards):
            wait_serving("%s.1%d:7000" % (SUBNET, k), "shard pod %d" % k)
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


# The example training job (deploy/k8s/examples): its Indexed Job's pod template rendered as
# one Pod per index, with what the Job controller adds (JOB_COMPLETION_INDEX) and worker 0's
# address on the test's network in place of its DNS name.
TRAIN_STEPS = 300


@pytest.fixture(scope="module")
def train_image(env):
    e, _ = env
    build = subprocess.run([os.path.join(ROOT, "deploy", "image", "build.sh"), "--train",
                            "--tag", TRAIN_TAG], cwd=ROOT, env=e, capture_output=True,
                           text=True, timeout=1800)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(build.stdout.strip())
    yield TRAIN_TAG
    podman(e, "image", "rm", "-f", TRAIN_TAG)


def train_pods(workers, steps, master_ip):
    job = yaml.safe_load(open(os.path.join(EXAMPLES, "train-job.yaml")))
    assert job["spec"]["completionMode"] == "Indexed"
    pods = []
    for k in range(workers):
        spec = copy.deepcopy(job["spec"]["template"]["spec"])
        c = spec["containers"][0]
        c["image"] = TRAIN_TAG
        c["args"] = [("--master=%s:29500" % master_ip) if a.startswith("--master=") else
                     ("--steps=%d" % steps) if a.startswith("--steps=") else a
                     for a in c["args"]]
        c["env"] = c.get("env", []) + [{"name": "JOB_COMPLETION_INDEX", "value": str(k)}]
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "%s-%d" % (job["metadata"]["name"], k),
                                  "labels": {"job-name": job["metadata"]["name"]}},
                     "spec": spec})
    return pods


def result_line(env, container):
    out = podman(env, "logs", container)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, "%s printed no JSON line: %s %s" % (container, out.stdout[-2000:],
                                                      out.stderr[-2000:])
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def loopback_digits(env, train_image):
    """The digits example as the README runs it (a local cluster on loopback), in the
    training image: what the pods must reach."""
    e, _ = env
    r = podman(e, "run", "--rm", "--network", "none", train_image, "python3",
               "examples/train_digits.py", "--mode", "near-lossless", "--workers", "2",
               "--shards", "3", "--steps", str(TRAIN_STEPS), "--progress", "never", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads([l for l in r.stdout.splitlines() if l.startswith("{")][-1])


def config_from_host(pods, config_dir):
    """The pods read cluster.yaml from config_dir instead of the ConfigMap: podman does not
    update a played ConfigMap, so a test that edits the config (as `kubectl edit` would)
    rewrites the file there, swapping it in as the kubelet does."""
    for pod in pods:
        for v in pod["spec"]["volumes"]:
            if v["name"] == "config":
                v.pop("configMap")
                v["hostPath"] = {"path": str(config_dir), "type": "Directory"}
    return pods


def write_config(config_dir, config):
    config_dir.mkdir(exist_ok=True)
    os.chmod(config_dir, 0o755)
    new = config_dir / "cluster.yaml.new"
    new.write_text(yaml.safe_dump(config))
    os.chmod(new, 0o644)
    os.replace(new, config_dir / "cluster.yaml")


def play_shards(env, tmp, name, config, ordinals, ip_prefix, config_dir=None):
    """Plays the config as the ConfigMap and the shard pods of `ordinals` (pod K at address
    ip_prefix + K); waits until each answers SERVING. Returns the played file and the
    ConfigMap."""
    m = manifests()
    cm = copy.deepcopy(m["ConfigMap"])
    cm["data"]["cluster.yaml"] = yaml.safe_dump(config)
    pods = [p for k, p in enumerate(shard_pods(max(ordinals) + 1, TAG)) if k in ordinals]
    if config_dir is not None:
        config_from_host(pods, config_dir)
    path = tmp / name
    path.write_text(yaml.safe_dump_all([cm] + pods))
    play(env, path, ["%s%d" % (ip_prefix, k) for k in ordinals])
    for k in ordinals:
        wait_serving("%s%d:7000" % (ip_prefix, k), "shard pod %d" % k)
    return path, cm


def shard_logs(env, shards):
    return {k: podman(env, "logs", "gcomp-shard-%d-shard" % k).stderr for k in range(shards)}


def print_tails(logs, chars=4000):
    """Prints the end of each shard's log (shown when a test fails); returns the logs."""
    for k, log in logs.items():
        print("--- shard pod %d ---\n%s" % (k, log[-chars:]))
    return logs


def down_shards(env, paths, shards):
    for path in paths:
        podman(env, "kube", "down", str(path))
    for k in range(shards):
        podman(env, "pod", "rm", "-f", "-t", "0", "gcomp-shard-%d" % k)
    podman(env, "volume", "rm", "-f", "gcomp-checkpoints")


def run_job(env, tmp, cm, workers, ip_prefix, during=None, config_dir=None):
    """Plays the example Job's worker pods (pod K at ip_prefix + K) and waits for them;
    `during()` runs once they are started. Returns worker 0's JSON line."""
    pods = train_pods(workers, TRAIN_STEPS, ip_prefix + "0")
    if config_dir is not None:
        config_from_host(pods, config_dir)
    job = tmp / "train-job.yaml"
    job.write_text(yaml.safe_dump_all([cm] + pods))
    names = ["gcomp-train-%d-worker" % k for k in range(workers)]
    try:
        play(env, job, ["%s%d" % (ip_prefix, k) for k in range(workers)])
        if during is not None:
            during()
        wait_exited(env, names, 600)
        for n in names:
            code = podman(env, "inspect", n, "--format", "{{.State.ExitCode}}").stdout.strip()
            assert code == "0", n + " exited " + code + ": " + podman(env, "logs", n).stderr[-3000:]
        return result_line(env, names[0])
    finally:
        podman(env, "kube", "down", str(job))


def assert_same_training(got, want):
    assert got["steps"] == want["steps"] == TRAIN_STEPS and got["transport"] == "ps", got
    assert got["test_accuracy"] == want["test_accuracy"], (got, want)
    assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6), (got, want)
    assert got["ratio"] > 3.0, got


def base_config(shards, ip_prefix):
    config = without_etcd(yaml.safe_load(manifests()["ConfigMap"]["data"]["cluster.yaml"]))
    assert config["workers"] == 2 and config["uplink"]["mode"] == "near-lossless"
    config["shards"] = {"count": shards, "address": ip_prefix + "{index}:7000"}
    return config


def test_training_job_pods_reach_the_loopback_accuracy(env, train_image, loopback_digits):
    """3 shard pods and the example Job's 2 worker pods (DDP through the gcomp package)
    train the digits model: the same held-out accuracy and loss as the loopback run."""
    e, tmp = env
    prefix = SUBNET + ".4"
    shard_yaml, cm = play_shards(e, tmp, "train-shards.yaml", base_config(3, prefix), range(3),
                                 prefix)
    try:
        got = run_job(e, tmp, cm, 2, SUBNET + ".5")
    finally:
        print_tails(shard_logs(e, 3))
        down_shards(e, [shard_yaml], 3)
    print(json.dumps({"pods": got, "loopback": loopback_digits}))
    assert_same_training(got, loopback_digits)


def test_a_deleted_shard_pod_fails_over_and_its_new_pod_rejoins(env, train_image,
                                                                 loopback_digits):
    """replicas: 2. Shard pod 1 is deleted while the job trains and played again (what the
    StatefulSet does): the job runs through and trains exactly as the loopback run."""
    e, tmp = env
    prefix = SUBNET + ".6"
    config = base_config(3, prefix)
    config["replicas"] = 2
    shard_yaml, cm = play_shards(e, tmp, "failover-shards.yaml", config, range(3), prefix)
    replayed = []

    def kill_and_recreate():
        time.sleep(6)  # the workers are past start-up and training
        podman(e, "pod", "rm", "-f", "-t", "0", "gcomp-shard-1", check=True)
        time.sleep(2)
        path, _ = play_shards(e, tmp, "failover-shard1.yaml", config, [1], prefix)
        replayed.append(path)

    try:
        got = run_job(e, tmp, cm, 2, SUBNET + ".7", during=kill_and_recreate)
    finally:
        logs = print_tails(shard_logs(e, 3))
        down_shards(e, [shard_yaml] + replayed, 3)
    print(json.dumps({"pods": got, "loopback": loopback_digits}))
    assert any("failover to epoch" in logs[k] for k in (0, 2)), logs
    # The new pod rejoins: the shards install a map with no shard down.
    assert "rejoining" in logs[1], logs[1][-3000:]
    assert all("(down: [])" in logs[k] for k in range(3)), logs
    assert_same_training(got, loopback_digits)


def test_the_played_cluster_scales_from_2_to_3_shard_pods_while_the_job_trains(
        env, train_image, loopback_digits):
    """The config edit of docs/DEPLOY.md ("Scale the shards") and a third shard pod while
    the worker pods train: the shards re-shard live and the job trains exactly as the
    loopback run."""
    e, tmp = env
    prefix = SUBNET + ".8"
    config_dir = tmp / "scale-config"
    config = base_config(2, prefix)
    write_config(config_dir, config)
    shard_yaml, cm = play_shards(e, tmp, "scale-shards.yaml", config, range(2), prefix,
                                 config_dir=config_dir)
    added = []

    def scale_up():
        # As soon as the workers train (a tensor declared): the job is ~11 s of steps, and
        # the edit, the new pod's start and the prepare take ~5 s of them. A fixed 6 s wait
        # once left the switch at the job's last step, and the re-shard never finished.
        deadline = time.time() + 60
        while "declared '" not in shard_logs(e, 1)[0]:
            assert time.time() < deadline, "the workers never declared a tensor"
            time.sleep(0.2)
        config["shards"]["count"], config["shard_map_epoch"] = 3, 2
        write_config(config_dir, config)
        path, _ = play_shards(e, tmp, "scale-shard2.yaml", config, [2], prefix,
                              config_dir=config_dir)
        added.append(path)

    try:
        got = run_job(e, tmp, cm, 2, SUBNET + ".9", during=scale_up, config_dir=config_dir)
    finally:
        logs = print_tails(shard_logs(e, 3))
        down_shards(e, [shard_yaml] + added, 3)
    print(json.dumps({"pods": got, "loopback": loopback_digits}))
    assert "re-shard done" in logs[0], logs[0][-3000:]
    assert "serving epoch 2" in logs[2], logs[2][-3000:]
    assert_same_training(got, loopback_digits)


def test_mtls_overlay_pods_serve_only_workers_with_the_certificate_and_token(env):
    """The mTLS overlay (deploy/k8s/overlays/mtls) played: its Secrets become host
    directories holding what `kubectl create secret` would (certificates from
    tools/make_test_certs.sh), and the shards' DNS names (gcomp-shard-K.gcomp-shard, in the
    certificates' subjectAltNames) map to the pods' addresses through hostAliases. The
    plaintext health port answers the kubelet's probe; workers with a client certificate
    and the job token train exactly; a worker with another token is refused."""
    sys.path.insert(0, HERE)
    from manifests_test import render_mtls
    e, tmp = env
    shards, workers = 3, 2
    certs = tmp / "certs"
    subprocess.run([os.path.join(ROOT, "tools", "make_test_certs.sh"), str(certs)], check=True,
                   capture_output=True)
    secrets = {}
    for name, files in {"shard-tls": {"ca.crt": "ca.pem", "tls.crt": "server.pem",
                                      "tls.key": "server.key"},
                        "worker-tls": {"ca.crt": "ca.pem", "tls.crt": "client.pem",
                                       "tls.key": "client.key"},
                        "token": {"token": "token"}}.items():
        d = tmp / name
        d.mkdir()
        for dest, src in files.items():
            shutil.copyfile(certs / src, d / dest)
            os.chmod(d / dest, 0o644)  # test keys; a Secret mount gives the pod's group access
        os.chmod(d, 0o755)
        secrets[name] = d
    other_token = tmp / "other-token"
    other_token.mkdir()
    (other_token / "token").write_text("f" * 64 + "\n")
    os.chmod(other_token, 0o755)
    os.chmod(other_token / "token", 0o644)

    rendered = render_mtls()
    cm = copy.deepcopy(rendered["ConfigMap/gcomp-config"])
    config = without_etcd(yaml.safe_load(cm["data"]["cluster.yaml"]))
    config["workers"] = workers
    config["uplink"] = config["downlink"] = {"mode": "lossless"}
    # podman starts the worker pods one after the other, seconds apart on a loaded machine:
    # the first step waits for both.
    config["step_timeout_ms"], config["rpc_timeout_ms"] = 30000, 60000
    config["connect_timeout_ms"] = 20000
    cm["data"]["cluster.yaml"] = yaml.safe_dump(config)
    address = config["shards"]["address"]  # gcomp-shard-{index}.gcomp-shard:7000, unchanged
    aliases = [{"ip": "%s.10%d" % (SUBNET, k),
                "hostnames": [address.split(":")[0].replace("{index}", str(k))]}
               for k in range(shards)]
    health_port = config["security"]["health_port"]

    pods = shard_pods(shards, TAG, sts=rendered["StatefulSet/gcomp-shard"])
    for pod in pods:
        pod["spec"]["hostAliases"] = aliases
        for v in pod["spec"]["volumes"]:
            if "secret" in v:
                v["hostPath"] = {"path": str(secrets["shard-tls" if v["name"] == "tls"
                                                     else "token"]), "type": "Directory"}
                del v["secret"]
    shard_yaml = tmp / "mtls-shards.yaml"
    shard_yaml.write_text(yaml.safe_dump_all([cm] + pods))
    data = gradient_dir(tmp / "mtls-data")

    def workers_yaml(name, token_dir):
        pods = worker_pods(workers, 20, data, name=name,
                           mounts=[("tls", secrets["worker-tls"], "/etc/gcomp-tls"),
                                   ("token", token_dir, "/etc/gcomp-token")])
        for pod in pods:
            pod["spec"]["hostAliases"] = aliases
            # The shards' names are in the pods' /etc/hosts only. gRPC's default (c-ares)
            # resolver still asks DNS for their AAAA records, and podman's DNS server passes
            # names it does not serve on to the host's resolvers, which a machine without a
            # network never answers: lookups then wait out their timeout (observed: 10-36 s
            # of a 20 s connect timeout). getaddrinfo answers from /etc/hosts.
            pod["spec"]["containers"][0]["env"] = [{"name": "GRPC_DNS_RESOLVER", "value": "native"}]
        path = tmp / (name + ".yaml")
        path.write_text(yaml.safe_dump_all([cm] + pods))
        return path, ["%s-%d-worker" % (name, w) for w in range(workers)]

    played = [shard_yaml]
    try:
        play(e, shard_yaml, ["%s.10%d" % (SUBNET, k) for k in range(shards)])
        for k in range(shards):
            wait_serving("%s.10%d:%d" % (SUBNET, k, health_port), "shard pod %d's health port" % k)
            # The service port speaks TLS only: a plaintext client gets no answer.
            assert health("%s.10%d:7000" % (SUBNET, k)) is None
        good, names = workers_yaml("gcomp-worker-tls", secrets["token"])
        played.append(good)
        play(e, good, ["%s.11%d" % (SUBNET, w) for w in range(workers)])
        wait_exited(e, names, 120)
        for n in names:
            r = result_line(e, n)
            assert r["ok"] and r["steps"] == 20 and r["exact"], json.dumps(r)
        bad, bad_names = workers_yaml("gcomp-worker-badtoken", other_token)
        played.append(bad)
        play(e, bad, ["%s.12%d" % (SUBNET, w) for w in range(workers)])
        wait_exited(e, bad_names, 120)
        for n in bad_names:
            r = result_line(e, n)
            assert not r["ok"] and "PERMISSION_DENIED" in r["error"], json.dumps(r)
    finally:
        print_tails(shard_logs(e, shards))
        for path in played[1:]:
            podman(e, "kube", "down", str(path))
        down_shards(e, [shard_yaml], shards)


# base's etcd StatefulSet (deploy/k8s/base/etcd-statefulset.yaml): each ordinal as a Pod, as
# the StatefulSet and the kubelet would run it, and the shards of base's config
# (replicas: 2, coordination.etcd naming the members) failing over through it.
ETCD_TAG = "localhost/gcomp-etcd:play-test"


@pytest.fixture(scope="module")
def etcd_image(env):
    e, _ = env
    build = subprocess.run([os.path.join(ROOT, "deploy", "image", "build.sh"), "--etcd",
                            "--tag", ETCD_TAG], cwd=ROOT, env=e, capture_output=True, text=True,
                           timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    print(build.stdout.strip())
    yield ETCD_TAG
    podman(e, "image", "rm", "-f", ETCD_TAG)


def expand_env_refs(pod):
    """What the kubelet does and podman 4.3 does not: $(VAR) in args replaced by the
    container's env, where a fieldRef to metadata.name is the pod's name."""
    for c in pod["spec"]["containers"]:
        values = {}
        for v in c.get("env", []):
            ref = v.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            assert ref in (None, "metadata.name"), ref
            values[v["name"]] = pod["metadata"]["name"] if ref else v["value"]
        c["args"] = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in c["args"]]
    return pod


def etcd_aliases(config, ip_prefix):
    """hostAliases mapping the config's etcd members (gcomp-etcd-K.gcomp-etcd) to
    ip_prefix + K: the test's stand-in for cluster DNS."""
    members = config["coordination"]["etcd"]
    return [{"ip": "%s%d" % (ip_prefix, k), "hostnames": [m.rsplit(":", 1)[0]]}
            for k, m in enumerate(members)]


def etcd_pods(image, aliases, data_root):
    """Each ordinal of base's etcd StatefulSet as a Pod. Its volumeClaimTemplate becomes a
    host directory per member, owned by the pods' uid: podman applies no fsGroup to its
    volumes, which the kubelet would."""
    sts = yaml.safe_load(open(os.path.join(BASE, "etcd-statefulset.yaml")))
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    uid = sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    pods = []
    for k in range(sts["spec"]["replicas"]):
        name = "%s-%d" % (sts["metadata"]["name"], k)
        spec = copy.deepcopy(sts["spec"]["template"]["spec"])
        spec["hostAliases"] = aliases
        for c in spec["containers"]:
            c["image"] = image
            c.pop("ports", None)  # as for the shards: podman would publish them on the host
        data = data_root / name
        data.mkdir(parents=True)
        os.chown(data, uid, uid)
        spec["volumes"] = spec.get("volumes", []) + [
            {"name": claim["metadata"]["name"], "hostPath": {"path": str(data), "type": "Directory"}}]
        pods.append(expand_env_refs({"apiVersion": "v1", "kind": "Pod",
                                     "metadata": {"name": name,
                                                  "labels": sts["spec"]["template"]["metadata"]["labels"]},
                                     "spec": spec}))
    return pods


def etcd_healthy(ip):
    """The readiness probe's question: /health on the member's metrics port."""
    try:
        with urllib.request.urlopen("http://%s:2381/health" % ip, timeout=2) as r:
            return json.loads(r.read()).get("health") == "true"
    except (OSError, ValueError):
        return False


# every_steps 0: no checkpoint is written before the deletion (SIGKILL: no final one
# either), so the new pod starts empty and catches up from its peers. every_steps 100: the
# new pod finds a set of a step long past in its folder; the run record in etcd says the
# job runs, so it restores nothing and rejoins (it once restored the old set and took its
# chunk back at that step: "future step 582 ... the shard is at step 500").
@pytest.mark.parametrize("every_steps", [0, 100])
def test_etcd_members_form_a_cluster_and_base_shards_fail_over_through_it(env, etcd_image,
                                                                          every_steps):
    """base's etcd StatefulSet played as 3 pods: every member answers /health and the
    cluster lists the three stable names. 3 shard pods with base's config (replicas: 2, its
    coordination.etcd unchanged, the names mapped to the members' addresses) serve two
    gcomp_worker pods; shard pod 1 is deleted mid-run and played again: the shards fail it
    over through etcd, it rejoins, and every worker result is exact."""
    e, tmp = env
    tmp = tmp / ("etcd-%d" % every_steps)
    tmp.mkdir()
    etcd_prefix, shard_prefix, worker_prefix = SUBNET + ".13", SUBNET + ".14", SUBNET + ".15"
    m = manifests()
    config = yaml.safe_load(m["ConfigMap"]["data"]["cluster.yaml"])
    assert config["replicas"] == 2 and len(config["coordination"]["etcd"]) == 3
    config["shards"] = {"count": 3, "address": shard_prefix + "{index}:7000"}
    config["uplink"] = config["downlink"] = {"mode": "lossless"}
    config["checkpoint"]["every_steps"] = every_steps
    aliases = etcd_aliases(config, etcd_prefix)
    etcd_yaml = tmp / "etcd.yaml"
    etcd_yaml.write_text(yaml.safe_dump_all(etcd_pods(etcd_image, aliases, tmp / "etcd-data")))
    cm = copy.deepcopy(m["ConfigMap"])
    cm["data"]["cluster.yaml"] = yaml.safe_dump(config)

    def shard_yaml(name, ordinals):
        pods = [p for k, p in enumerate(shard_pods(3, TAG)) if k in ordinals]
        for pod in pods:
            pod["spec"]["hostAliases"] = aliases
            # The etcd names are in /etc/hosts only; see the mTLS test on gRPC's resolver.
            pod["spec"]["containers"][0]["env"] = [{"name": "GRPC_DNS_RESOLVER", "value": "native"}]
        path = tmp / name
        path.write_text(yaml.safe_dump_all([cm] + pods))
        return path

    data = gradient_dir(tmp / "etcd-data-g")
    steps = 3000
    workers_yaml = tmp / "etcd-workers.yaml"
    workers_yaml.write_text(yaml.safe_dump_all([cm] + worker_pods(2, steps, data)))
    names = ["gcomp-worker-%d-worker" % w for w in range(2)]
    shards, replayed = shard_yaml("etcd-shards.yaml", range(3)), []
    try:
        play(e, etcd_yaml, ["%s%d" % (etcd_prefix, k) for k in range(3)])
        deadline = time.time() + 60
        while not all(etcd_healthy("%s%d" % (etcd_prefix, k)) for k in range(3)):
            assert time.time() < deadline, "etcd members never all reported healthy"
            time.sleep(0.5)
        r = podman(e, "exec", "gcomp-etcd-0-etcd", "etcdctl", "--endpoints=http://localhost:2379",
                   "member", "list", check=True)
        assert sorted(l.split(", ")[2] for l in r.stdout.splitlines()) == [
            "gcomp-etcd-0", "gcomp-etcd-1", "gcomp-etcd-2"], r.stdout
        play(e, shards, ["%s%d" % (shard_prefix, k) for k in range(3)])
        for k in range(3):
            wait_serving("%s%d:7000" % (shard_prefix, k), "shard pod %d" % k)
        play(e, workers_yaml, ["%s%d" % (worker_prefix, w) for w in range(2)])
        time.sleep(4)
        podman(e, "pod", "rm", "-f", "-t", "0", "gcomp-shard-1", check=True)
        r = podman(e, "ps", "--format", "{{.Names}}")
        assert all(n in r.stdout.split() for n in names), \
            "the workers finished before the shard was deleted: raise `steps`"
        time.sleep(2)
        replayed.append(shard_yaml("etcd-shard1.yaml", [1]))
        play(e, replayed[0], [shard_prefix + "1"])
        wait_exited(e, names, 300)
        for n in names:
            result = result_line(e, n)
            assert result["ok"] and result["steps"] == steps and result["exact"], json.dumps(result)
        keys = podman(e, "exec", "gcomp-etcd-0-etcd", "etcdctl", "--endpoints=http://localhost:2379",
                      "get", "--prefix", "/gcomp/%s/" % config["job"], "--keys-only",
                      check=True).stdout.split()
        assert {"/gcomp/%s/%s" % (config["job"], k) for k in ("map", "coordinator", "run")} <= set(keys), keys
        assert {"/gcomp/%s/members/%d" % (config["job"], k) for k in range(3)} <= set(keys), keys
    finally:
        logs = print_tails(shard_logs(e, 3))
        podman(e, "kube", "down", str(workers_yaml))
        down_shards(e, [shards] + replayed, 3)
        podman(e, "kube", "down", str(etcd_yaml))
    assert any("failover to epoch" in logs[k] for k in (0, 2)), logs
    assert "rejoining" in logs[1], logs[1][-3000:]
    assert all("(down: [])" in logs[k] for k in range(3)), logs

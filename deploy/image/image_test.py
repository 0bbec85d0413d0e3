"""The runtime image, built for real with podman from deploy/image/Containerfile (so the
file cannot rot): small, non-root, and able to run a shard and two workers with a
read-only root filesystem.

    /usr/bin/python3 -m pytest -q deploy/image

Needs root, podman, runc and debootstrap (tools/bootstrap.sh installs them) and the Debian
mirror apt uses; skips with the reason otherwise. The first build makes the base image
with debootstrap (about a minute); later ones reuse it.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TAG = "localhost/gcomp:image-test"
# What this sandbox needs to run containers (ulimits cannot be raised, cgroups are v1 in a
# way crun rejects); harmless on an ordinary host.
CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
"""


def missing():
    if os.geteuid() != 0:
        return "needs root for podman and debootstrap"
    for tool in ("podman", "runc", "debootstrap", "bazel"):
        if shutil.which(tool) is None:
            return "%s is not installed (tools/bootstrap.sh installs it)" % tool
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("image")
    conf = tmp / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    # The test suite's own build of the binaries (no second, -c opt, compile in CI).
    env = dict(os.environ, CONTAINERS_CONF=str(conf), PODMAN="podman --runtime runc",
               BAZEL_FLAGS="")
    build = subprocess.run([os.path.join(HERE, "build.sh"), "--tag", TAG], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=1200)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    yield env, build.stdout, tmp
    subprocess.run(["podman", "--runtime", "runc", "image", "rm", "-f", TAG], env=env,
                   capture_output=True)


def run(env, *args, timeout=120):
    return subprocess.run(["podman", "--runtime", "runc", "run", "--rm", "--network", "none",
                           *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_image_is_small_and_says_its_size(image):
    env, out, _ = image
    m = re.search(r"image %s: (\d+) MB" % re.escape(TAG), out)
    assert m, out
    assert int(m.group(1)) < 200, out


def test_image_runs_as_non_root_with_every_tool(image):
    env, _, _ = image
    r = run(env, TAG, "sh", "-c", "id -u; for t in gcomp_server gcomp_worker gcomp gcomp_admin; "
            "do command -v $t; done; "
            "command -v g++ bazel || echo no-toolchain")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[0] == "10001"
    assert [os.path.basename(p) for p in lines[1:5]] == ["gcomp_server", "gcomp_worker", "gcomp",
                                                        "gcomp_admin"]
    assert lines[-1] == "no-toolchain"
    r = run(env, TAG, "gcomp_admin")
    assert r.returncode == 2 and "usage: gcomp_admin" in r.stderr, r.stderr


def test_image_and_binaries_name_the_release_and_revision(image):
    env, _, _ = image
    release = open(os.path.join(ROOT, "VERSION")).read().strip()
    labels = json.loads(subprocess.run(
        ["podman", "--runtime", "runc", "image", "inspect", TAG, "--format", "{{json .Labels}}"],
        env=env, capture_output=True, text=True, check=True).stdout)
    assert labels["org.opencontainers.image.version"] == release, labels
    revision = labels["org.opencontainers.image.revision"]
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?|unknown", revision), labels
    assert labels["org.opencontainers.image.source"], labels
    r = run(env, TAG, "gcomp_server", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "gcomp_server %s (revision %s)" % (release, revision)


def test_a_shard_and_two_workers_train_in_a_read_only_container(image):
    env, _, tmp = image
    data = tmp / "data"
    data.mkdir()
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "write_npy.py"),
                    str(data / "g.npy"), "65536", "sine"], check=True)
    (data / "c.yaml").write_text("job: image\nworkers: 2\nshards: [127.0.0.1:7000]\n"
                                 "uplink: {mode: lossless}\ndownlink: {mode: lossless}\n")
    (data / "job.sh").write_text(
        "#!/bin/sh\n"
        "gcomp_server --config /data/c.yaml --shard 0 --metrics_address none 2>/tmp/s.log &\n"
        "server=$!\n"
        "gcomp_worker --config /data/c.yaml --worker 1 --gradients /data/g.npy --steps 3 "
        "--progress never >/dev/null 2>/tmp/w1.log &\n"
        "w1=$!\n"
        "gcomp_worker --config /data/c.yaml --worker 0 --gradients /data/g.npy --steps 3 "
        "--progress never\n"
        "rc=$?\nwait $w1 || rc=1\nkill $server\nwait $server\nexit $rc\n")
    os.chmod(data / "job.sh", 0o755)
    r = run(env, "--read-only", "--tmpfs", "/tmp", "-v", "%s:/data:ro" % data, TAG, "/data/job.sh")
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"ok":true' in r.stdout and '"exact":true' in r.stdout, r.stdout

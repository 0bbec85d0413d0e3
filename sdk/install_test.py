"""The C++ SDK used the way a CMake/Make project would: tools/install_sdk.sh makes an install
tree, a program is compiled with plain g++ and pkg-config outside the Bazel workspace, and
two copies of it push-pull through two real gcomp_server shards."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def test_installed_sdk_builds_with_pkg_config_and_push_pulls(tmp_path):
    for tool in ("bazel", "g++", "pkg-config"):
        if shutil.which(tool) is None:
            pytest.skip("%s is not installed (tools/bootstrap.sh)" % tool)
    from gcomp import cluster
    why = cluster.server_missing()
    if why:
        pytest.skip(why)
    prefix = tmp_path / "prefix"
    subprocess.run([os.path.join(ROOT, "tools", "install_sdk.sh"), str(prefix)], check=True,
                   capture_output=True, timeout=1800)
    # Only the documented surface is installed.
    installed = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if not p.is_dir())
    assert installed == ["include/gcomp/client.h", "lib/libgcomp_client.so",
                         "lib/libgcomp_client.so.0", "lib/pkgconfig/gcomp-client.pc"]
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "gcomp-client"], env=env,
                           check=True, capture_output=True, text=True).stdout.split()
    program = tmp_path / "push_pull"
    source = tmp_path / "push_pull.cc"  # compiled from outside the workspace
    shutil.copy(os.path.join(ROOT, "sdk", "example", "push_pull.cc"), source)
    build = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", str(source), "-o",
                            str(program)] + flags, capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    elements, steps = 70000, 3
    with cluster.LocalCluster(shards=2, workers=2, mode="lossless", workdir=str(tmp_path)) as c:
        procs = [subprocess.Popen([str(program), c.config_path, str(w), "2", str(elements),
                                   str(steps)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, cwd=tmp_path) for w in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        r = json.loads(out.strip().splitlines()[-1])
        assert r["steps"] == steps
        assert r["max_rel_err"] < 1e-6  # lossless both ways: the float32 mean
        assert r["raw_bytes_sent"] == steps * elements * 4 and r["wire_bytes_sent"] > 0
        assert r["undeclared_code"] != 0

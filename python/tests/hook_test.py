"""gcomp.torch.ps_hook and GradientSync under a gloo process group of 2 processes: the
gradient every rank ends up with is the mean of the ranks' gradients (exactly for "none"
and "lossless", within the codec's bound for "near-lossless")."""
import json
import os
import socket
import subprocess
import sys

import pytest

import gcomp

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(mode, tmp_path, world=2, cluster_config=None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, outs = [], []
    for r in range(world):
        out = str(tmp_path / ("rank%d.json" % r))
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "hook_worker.py"), "--rank", str(r),
             "--world", str(world), "--port", str(port), "--mode", mode, "--out", out]
            + (["--cluster-config", cluster_config] if cluster_config else []),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        try:
            log, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            log, _ = p.communicate()
            pytest.fail("rank did not finish within 120 s:\n" + log)
        assert p.returncode == 0, log
    return [json.load(open(o)) for o in outs]


def needs_codec(mode):
    if mode != "none" and not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())


@pytest.mark.parametrize("mode", ["none", "lossless"])
def test_hook_gives_the_exact_mean(mode, tmp_path):
    needs_codec(mode)
    results = run_ranks(mode, tmp_path)
    for r in results:
        assert r["ddp_max_err"] == [0.0, 0.0, 0.0]
        assert r["sync_max_err"] == [0.0, 0.0]
        assert r["ddp_keys"] and all(k.startswith("ddp/bucket") for k in r["ddp_keys"])
        assert r["sync_buckets"] >= 2
    if mode == "none":
        assert results[0]["ddp_wire_bytes"] == results[0]["ddp_raw_bytes"]
    else:
        assert results[0]["ddp_wire_bytes"] < results[0]["ddp_raw_bytes"]


def test_hook_near_lossless_within_bound_with_error_feedback(tmp_path):
    needs_codec("near-lossless")
    results = run_ranks("near-lossless", tmp_path)
    for r in results:
        # Up and down each lose at most 2^-8 of the block maximum (rel_bits = 7); the
        # residual of step k is added at step k+1, so allow both steps' share.
        for err, m in zip(r["ddp_max_err"], r["ref_max_abs"]):
            assert err <= 4 * 2.0 ** -8 * m
        assert r["residual_keys"] >= 1
        assert r["ddp_raw_bytes"] / r["ddp_wire_bytes"] > 2


@pytest.mark.parametrize("mode", ["none", "lossless", "near-lossless"])
def test_hook_through_the_shards(mode, tmp_path):
    """The same DDP job with the hook pushing to 2 real gcomp_server shards."""
    from gcomp import cluster
    why = cluster.server_missing()
    if why:
        pytest.skip(why)
    if not gcomp.have_extension() or not getattr(gcomp.extension(), "HAS_CLIENT", False):
        pytest.skip(gcomp.extension_error() or "the extension has no worker Client")
    with cluster.LocalCluster(shards=2, workers=2, mode=mode, workdir=str(tmp_path)) as c:
        results = run_ranks(mode, tmp_path, cluster_config=c.config_path)
    for r in results:
        for err, m in zip(r["ddp_max_err"] + r["sync_max_err"], r["ref_max_abs"] * 2):
            if mode == "near-lossless":
                assert err <= 4 * 2.0 ** -8 * m
            else:
                assert err <= 1e-6 * m  # the shards' summation order may round differently
        if mode == "none":
            assert r["ddp_wire_bytes"] == r["ddp_raw_bytes"]
        else:
            assert r["ddp_wire_bytes"] < r["ddp_raw_bytes"]

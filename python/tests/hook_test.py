"""gcomp.torch.ps_hook and GradientSync under a gloo process group of 2 processes: the
gradient every rank ends up with is the mean of the ranks' gradients (exactly for "none"
and "lossless", within the codec's bound for "near-lossless")."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import gcomp

HERE = os.path.dirname(os.path.abspath(__file__))


def run_ranks(mode, tmp_path, world=2, cluster_config=None, dtype="f32"):
    # A file, not a TCP port picked beforehand (which a shard could take meanwhile).
    rendezvous = "file://" + str(tmp_path / ("process-group-" + os.urandom(6).hex()))
    procs, outs = [], []
    for r in range(world):
        out = str(tmp_path / ("rank%d.json" % r))
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "hook_worker.py"), "--rank", str(r),
             "--world", str(world), "--init-method", rendezvous, "--mode", mode, "--out", out,
             "--dtype", dtype]
            + (["--cluster-config", cluster_config] if cluster_config else []),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
        try:
            log, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            # Every rank prints its threads' Python stacks (hook_worker registers SIGUSR1).
            for q in procs:
                q.send_signal(signal.SIGUSR1)
            time.sleep(2)
            for q in procs:
                q.kill()
            logs = ["rank %d:\n%s" % (r, q.communicate()[0]) for r, q in enumerate(procs)]
            pytest.fail("rank did not finish within 120 s:\n" + "\n".join(logs))
        assert p.returncode == 0, log
    return [json.load(open(o)) for o in outs]


def needs_codec(mode):
    if mode != "none" and not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())


def needs_shards():
    """gcomp.cluster, once gcomp_server and the extension's worker Client are built."""
    from gcomp import cluster
    why = cluster.server_missing()
    if why:
        pytest.skip(why)
    if not gcomp.have_extension() or not getattr(gcomp.extension(), "HAS_CLIENT", False):
        pytest.skip(gcomp.extension_error() or "the extension has no worker Client")
    return cluster


@pytest.mark.parametrize("mode", ["none", "lossless"])
def test_hook_gives_the_exact_mean(mode, tmp_path):
    needs_codec(mode)
    results = run_ranks(mode, tmp_path)
    for r in results:
        assert r["start_equal"]  # rank 1 started apart: DDP's broadcast brought rank 0's values
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
    cluster = needs_shards()
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


def test_a_failed_push_pull_names_its_cause(tmp_path):
    """A step after the only shard stopped: DDP's backward raises naming the worker
    Client's error (torch 1.13 once turned a hook's exception into "Unable to cast ... to
    Tensor"), and GradientSync.sync() raises that error itself."""
    needs_shards()
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "hook_error_worker.py"), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["before"] == [None, None]
    ddp, plain = result["after"]
    assert ddp is not None and plain is not None, result
    assert "Unable to cast" not in ddp["message"]
    assert "ConnectionError: UNAVAILABLE: push-pull of 'ddp/bucket0/" in ddp["message"]
    assert plain["type"] == "ConnectionError"
    assert plain["message"].startswith("UNAVAILABLE: push-pull of 'grads/0/")
    for closed in result["closed"]:
        assert closed is not None, result
        assert "INTERNAL ASSERT" not in closed["message"], closed
        assert "PSHookState or GradientSync (prefix 'ddp') is closed" in closed["message"]


# One rounding of the float32 mean to the dtype: at most half a unit in the last place,
# relative (bfloat16 keeps 8 significant bits, float16 11), plus float16's subnormal step.
ROUNDING = {"bf16": (2.0 ** -8, 0.0), "f16": (2.0 ** -11, 2.0 ** -24)}


def half_precision_bound(dtype, mode, m, error_feedback):
    rel, floor = ROUNDING[dtype]
    bound = rel * m + floor
    if mode == "near-lossless":
        # Up and down each lose at most 2^-8 of the block maximum (rel_bits = 7), and with
        # error feedback the residual of the step before is in this step's push too.
        bound += (4 if error_feedback else 2) * 2.0 ** -8 * m
    return bound


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("mode", ["none", "lossless", "near-lossless"])
@pytest.mark.parametrize("where", ["gloo", "shards"])
def test_half_precision_gradients(where, mode, dtype, tmp_path):
    """bfloat16 (DDP hook and GradientSync on a bf16 model) and float16 (GradientSync of
    hand-set gradients) keys are declared, compressed and averaged in their dtype: every
    rank gets the float32 mean of the ranks' gradients rounded once to the dtype."""
    needs_codec(mode)
    if where == "shards":
        cluster = needs_shards()
        with cluster.LocalCluster(shards=2, workers=2, mode=mode, workdir=str(tmp_path)) as c:
            results = run_ranks(mode, tmp_path, cluster_config=c.config_path, dtype=dtype)
    else:
        results = run_ranks(mode, tmp_path, dtype=dtype)
    for r in results:
        if dtype == "bf16":
            assert r["start_equal"]  # gcomp.torch.broadcast_in_float32
            assert len(r["ddp_max_err"]) == 3 and r["ddp_keys"]
            for err, m in zip(r["ddp_max_err"], r["ref_max_abs"]):
                assert err <= half_precision_bound(dtype, mode, m, mode == "near-lossless")
            ddp_ratio = r["ddp_raw_bytes"] / r["ddp_wire_bytes"]
            assert ddp_ratio == 1.0 if mode == "none" else ddp_ratio > 1.0
        assert len(r["sync_max_err"]) == 2 and r["sync_buckets"] >= 2
        for err, m in zip(r["sync_max_err"], r["sync_ref_max_abs"]):
            assert err <= half_precision_bound(dtype, mode, m, False)
    # Every rank ends with the same mean.
    assert results[0]["sync_max_err"] == results[1]["sync_max_err"]

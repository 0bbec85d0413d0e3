"""A DDP step that fails for some of its buckets only, run again as python/README.md says:
the workers stay in line and end exactly as an undisturbed run (lossless shards). Before,
the buckets whose step had completed moved on alone, and the ranks' models drifted apart."""
import json
import os
import subprocess
import sys

import pytest

import gcomp
from ranks import wait_all  # this folder is on sys.path: the test's own

HERE = os.path.dirname(os.path.abspath(__file__))


def run(c, tmp_path, name, late_s):
    rendezvous = "file://" + str(tmp_path / ("process-group-" + name))
    outs = [str(tmp_path / ("%s%d.json" % (name, r))) for r in range(2)]
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "partial_failure_worker.py"), "--rank", str(r),
         "--init-method", rendezvous, "--cluster-config", c.config_path, "--prefix", name,
         "--late-s", str(late_s), "--out", outs[r]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    wait_all(procs, 180)
    return [json.load(open(o)) for o in outs]


def test_a_step_failed_in_one_bucket_and_run_again_matches_an_undisturbed_run(tmp_path):
    from gcomp import cluster
    why = cluster.server_missing()
    if why:
        pytest.skip(why)
    if not gcomp.have_extension() or not getattr(gcomp.extension(), "HAS_CLIENT", False):
        pytest.skip(gcomp.extension_error() or "the extension has no worker Client")
    with cluster.LocalCluster(shards=2, workers=2, mode="lossless", workdir=str(tmp_path),
                              step_timeout_ms=1500) as c:
        ref = run(c, tmp_path, "ref", 0)
        late = run(c, tmp_path, "late", 3.0)
    assert ref[0]["errors"] == [] and ref[1]["errors"] == []
    assert ref[0]["params"] == ref[1]["params"]
    # Rank 0's step failed in a later bucket only (the earlier ones completed); once run
    # again, nothing else failed.
    assert len(late[0]["errors"]) == 1, late[0]["errors"]
    assert "step 2 attempt 0" in late[0]["errors"][0] and "timed out" in late[0]["errors"][0]
    assert late[1]["errors"] == []
    assert late[0]["params"] == late[1]["params"], "the ranks drifted apart"
    assert late[0]["params"] == ref[0]["params"]

"""ps_hook under DDP settings beyond the defaults, 2 gloo ranks, lossless (so the mean is
exact): several buckets, gradient_as_bucket_view=True, find_unused_parameters=True with a
head that is trained only every other step, one large bucket; every step (including those
after DDP rebuilds its buckets at the end of the first) gives every rank the exact mean."""
import json
import os
import subprocess
import sys

import pytest

import gcomp
from ranks import wait_all  # this folder is on sys.path: the test's own

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("option", ["several_buckets", "gradient_as_bucket_view",
                                    "find_unused_parameters", "large_buckets"])
def test_hook_gives_the_exact_mean_under_ddp_option(option, tmp_path):
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    # A file, not a TCP port picked beforehand (which another process could take meanwhile).
    rendezvous = "file://" + str(tmp_path / ("process-group-" + os.urandom(6).hex()))
    outs = [str(tmp_path / ("rank%d.json" % r)) for r in range(2)]
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_options_worker.py"),
                               "--rank", str(r), "--world", "2", "--init-method", rendezvous,
                               "--option", option, "--out", outs[r]],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    wait_all(procs, 180)
    for out in outs:
        r = json.load(open(out))
        assert r["max_err"] == [0.0] * 4, r
        # Keys are bucket index and size: those of step 0 (torch 1.13 puts this model in
        # one bucket at first), then those of the buckets DDP rebuilds at the start of step
        # 1 in gradient order, cut at bucket_cap_mb (no rebuild with unused parameters).
        assert all(k.startswith("ddp/bucket") for k in r["keys"])
        assert r["keys_per_step"][0] >= 1 and sum(r["keys_per_step"][2:]) == 0
        assert r["rebuilt"] in (option != "find_unused_parameters", None)
        if option in ("several_buckets", "gradient_as_bucket_view"):
            assert r["keys_per_step"][1] >= 2

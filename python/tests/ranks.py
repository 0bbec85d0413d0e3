"""The rank processes of the multi-process tests."""
import subprocess

import pytest


def wait_all(procs, timeout_s):
    """Waits for every rank (subprocess.Popen with its output piped); kills them all and
    fails the test with a rank's output when one runs past `timeout_s` or exits non-zero."""
    for p in procs:
        try:
            log, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("rank did not finish within %d s:\n%s" % (timeout_s, p.communicate()[0]))
        assert p.returncode == 0, log

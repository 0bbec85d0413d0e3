"""Short run of bench/train_bench.py so it cannot rot: one rate (1 Gbit/s), the tiny model,
a few steps, W = 2, S = 1; DDP, the fp16 hook and gcomp-ps none, lossless, near-lossless.

Skips (with the reason) without root, ip/tc, network namespaces or tbf, or without the
built extension and gcomp_server (bazel build //python:_gcomp.so //server:gcomp_server).
"""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_bench  # noqa: E402

SYSTEMS = ("ddp", "fp16", "gcomp-none", "gcomp-lossless", "gcomp-near-lossless")


def _skip_unless_runnable():
    why = train_bench.check_environment()
    if why:
        pytest.skip("emulated hosts unavailable: " + why)
    sys.path[:0] = train_bench.PYTHONPATH
    import gcomp
    from gcomp import cluster
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    if cluster.server_missing():
        pytest.skip(cluster.server_missing())


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_short_run(tmp_path):
    _skip_unless_runnable()
    before = _namespaces()
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "train_bench.py"), "--model", "tiny",
         "--rates", "1gbit", "--workers", "2", "--shards", "1", "--steps", "6",
         "--eval-every", "3", "--lr", "0.2", "--systems", ",".join(SYSTEMS),
         "--out-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    # Everything it made is gone.
    assert _namespaces() == before
    with open(tmp_path / "runs.jsonl") as f:
        rows = {r["system"]: r for r in map(json.loads, f)}
    assert sorted(rows) == sorted(SYSTEMS)
    for system, row in rows.items():
        assert "error" not in row, (system, row.get("error"))
        for key in ("median_step_s", "final_metric", "tx_bytes_per_step",
                    "rx_bytes_per_step", "cpu_s_per_step"):
            assert row[key] > 0, (system, key, row[key])
        assert len(row["step_s"]) == 6
    # The counters are the links' own: every worker sent and received gradient bytes,
    # and near-lossless put fewer of them on the link than allreduce.
    params_bytes = rows["ddp"]["params"] * 4
    assert rows["ddp"]["tx_bytes_per_step"] > 0.5 * params_bytes
    assert rows["gcomp-near-lossless"]["tx_bytes_per_step"] < rows["ddp"]["tx_bytes_per_step"]
    assert rows["gcomp-near-lossless"]["rx_bytes_per_step"] < rows["ddp"]["rx_bytes_per_step"]
    assert rows["fp16"]["tx_bytes_per_step"] < rows["ddp"]["tx_bytes_per_step"]
    # Lossless returns the exact mean: the same training as none, to the last bit.
    assert rows["gcomp-lossless"]["final_metric"] == rows["gcomp-none"]["final_metric"]
    assert rows["gcomp-lossless"]["train_loss"] == rows["gcomp-none"]["train_loss"]
    table = (tmp_path / "table.md").read_text()
    for system in SYSTEMS:
        assert "| %s |" % system in table


def test_bad_flags_are_refused():
    for argv, words in ((["--rates", "fast"], "is not NUMBER"),
                        (["--systems", "ddp,allgather"], "unknown system 'allgather'"),
                        (["--workers", "3", "--model", "tiny"], "multiple of every --workers"),
                        (["--steps", "1"], "--steps must be at least 2")):
        out = subprocess.run([sys.executable, os.path.join(HERE, "train_bench.py")] + argv,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and words in out.stderr, (argv, out.stderr)


def test_render_divides_by_the_baseline_of_the_same_repeat():
    def rec(system, repeat, step, evals):
        return {"model": "m", "rate": "1gbit", "workers": 2, "system": system, "shards": 0,
                "repeat": repeat, "params": 10, "metric": "acc", "higher_is_better": True,
                "median_step_s": step, "evals": evals, "final_metric": evals[-1][2],
                "tx_bytes_per_step": 1e6, "rx_bytes_per_step": 1e6, "cpu_s_per_step": 0.1,
                "shard_cpu_s_per_step": 0.0}
    table = train_bench.render([
        rec("ddp", 0, 2.0, [[1, 2.0, 0.5], [2, 4.0, 0.9]]),
        rec("fp16", 0, 1.0, [[1, 1.0, 0.5], [2, 2.0, 0.95]]),
        {"model": "m", "rate": "1gbit", "workers": 2, "system": "powersgd-4", "shards": 0,
         "repeat": 0, "error": "worker 1 exited -6: EnforceNotMet"}])
    fp16 = next(l for l in table.splitlines() if l.startswith("| fp16 |"))
    cells = [c.strip() for c in fp16.split("|")[1:-1]]
    assert cells[3] == "1.000" and cells[4] == "2.00"  # median step, x DDP
    assert cells[5] == "2.0" and cells[6] == "2.00"    # time to 0.89, x DDP
    assert "| powersgd-4 | - | 1 | failed: worker 1 exited -6: EnforceNotMet" in table

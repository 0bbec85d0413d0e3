"""Short real training runs of the examples, one per mode: the final JSON line has the
documented keys, lossless equals none exactly, near-lossless compresses."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import gcomp  # noqa: E402

KEYS = {"mode", "steps", "train_loss", "raw_bytes", "wire_bytes", "ratio", "seconds",
        "transport"}


def train(script, mode, steps=4, extra=()):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, script), "--mode", mode, "--workers", "2",
         "--shards", "2", "--steps", str(steps), "--seed", "1"] + list(extra),
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def digits_runs():
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    return {m: train("train_digits.py", m, extra=["--batch", "32"])
            for m in ("none", "lossless", "near-lossless")}


def test_digits_every_mode_prints_the_result_line(digits_runs):
    for mode, r in digits_runs.items():
        assert set(r) == KEYS | {"test_accuracy"}
        assert r["mode"] == mode and r["steps"] == 4
        assert 0.0 <= r["test_accuracy"] <= 1.0
        assert r["raw_bytes"] > 0 and r["wire_bytes"] > 0
        sys.path.insert(0, HERE)
        import common
        assert r["transport"] == ("ps" if common.ps_available() is None else "gloo")


def test_digits_lossless_matches_none_exactly(digits_runs):
    none, lossless = digits_runs["none"], digits_runs["lossless"]
    assert lossless["train_loss"] == none["train_loss"]
    assert lossless["test_accuracy"] == none["test_accuracy"]
    assert none["ratio"] == 1.0 and lossless["ratio"] > 1.0


def test_digits_near_lossless_compresses(digits_runs):
    assert digits_runs["near-lossless"]["ratio"] >= 3.0


def test_text_near_lossless_runs():
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    r = train("train_text.py", "near-lossless", steps=2, extra=["--batch", "4"])
    assert set(r) == KEYS | {"test_loss"}
    assert r["test_loss"] > 0 and r["ratio"] > 2.0


def copy_without_build(tmp_path):
    """The examples and the gcomp package in a tree with no bazel-bin: no extension."""
    import shutil
    root = tmp_path / "checkout"
    shutil.copytree(HERE, root / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(os.path.dirname(HERE), "python", "gcomp"),
                    root / "python" / "gcomp", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return root / "examples" / "train_digits.py", env


@pytest.mark.parametrize("flags, expected", [
    (["--mode", "near-lossless"], "error: --mode near-lossless needs the _gcomp extension"),
    (["--mode", "none", "--transport", "ps"], "error: --transport ps cannot run: the _gcomp"),
])
def test_example_without_the_extension_fails_at_once_naming_the_fix(tmp_path, flags, expected):
    script, env = copy_without_build(tmp_path)
    out = subprocess.run([sys.executable, str(script), "--workers", "2", "--steps", "1"] + flags,
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith(expected), out.stderr
    assert "bazel build //python:_gcomp.so" in lines[-1]
    assert "Traceback" not in out.stderr


def test_example_auto_without_the_extension_names_gloo(tmp_path):
    script, env = copy_without_build(tmp_path)
    out = subprocess.run([sys.executable, str(script), "--mode", "none", "--workers", "2",
                          "--steps", "2", "--batch", "32"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["transport"] == "gloo" and r["mode"] == "none" and r["ratio"] == 1.0
    assert "using the gloo transport" in out.stderr


def test_digits_aggressive_preset_compresses_more(digits_runs):
    r = train("train_digits.py", "near-lossless", extra=["--batch", "32", "--preset", "aggressive"])
    assert set(r) == KEYS | {"test_accuracy"} and r["mode"] == "near-lossless"
    assert r["ratio"] > digits_runs["near-lossless"]["ratio"]


@pytest.mark.parametrize("flags, expected", [
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--shards", "0"], "--shards must be at least 1, got 0"),
    (["--workers", "0"], "--workers must be at least 1, got 0"),
    (["--batch", "-4"], "--batch must be at least 1, got -4"),
    (["--batch", "33"], "--batch 33 must be a multiple of --workers (2)"),
    (["--lr", "-1"], "--lr must be a positive number, got -1.0"),
    (["--lr", "nan"], "--lr must be a positive number, got nan"),
    (["--rel-bits", "40"], "rel_bits must be in [0, 23], got 40"),
    (["--abs-log2", "3"], "abs_log2 must be in [-128, 0], got 3"),
    (["--mode", "none", "--error-feedback"], "--error-feedback needs --mode near-lossless"),
    (["--mode", "lossless", "--rel-bits", "3"], "--rel-bits is a near-lossless setting"),
])
def test_launcher_flags_are_checked_before_anything_starts(flags, expected):
    # Checked before any process starts or the extension is needed (works without a build).
    out = subprocess.run([sys.executable, os.path.join(HERE, "train_digits.py"), "--workers", "2"]
                         + flags, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_compare_routes_and_refuses_the_flags_after_the_separator():
    sys.path.insert(0, HERE)
    import compare
    assert compare.split_extra(["--rel-bits", "5", "--batch", "32", "--abs-log2=-12"]) == (
        ["--batch", "32"], ["--rel-bits", "5", "--abs-log2=-12"])
    for flags, expected in ((["--", "--mode", "lossless"], "--mode is set by compare.py"),
                            (["--", "--error-feedback"], "--error-feedback is set by compare.py"),
                            (["--", "--workers=3"], "give compare.py's own --workers"),
                            (["--steps", "-3"], "--steps must be at least 1"),
                            (["--shards", "0"], "--shards must be at least 1, got 0")):
        out = subprocess.run([sys.executable, os.path.join(HERE, "compare.py")] + flags,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert expected in out.stderr, out.stderr


def test_preset_is_refused_outside_near_lossless():
    out = subprocess.run([sys.executable, os.path.join(HERE, "train_digits.py"), "--mode",
                          "lossless", "--preset", "aggressive"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--preset aggressive is a near-lossless setting" in out.stderr


# --cluster-config: the script as one worker of a job on shards that already run (a pod of
# the example Indexed Job, deploy/k8s/examples/).
def cluster_workers(config_path, workers, extra=(), env_of=lambda r: {}):
    sys.path.insert(0, HERE)
    import common
    port = common.free_port()
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(HERE, "train_digits.py"), "--cluster-config", config_path,
         "--master", "127.0.0.1:%d" % port, "--progress", "never"] + list(extra),
        env=dict(os.environ, GLOO_SOCKET_IFNAME="lo", **env_of(r)), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for r in range(workers)]
    return [(p.wait(timeout=600), p.stdout.read(), p.stderr.read()) for p in procs]


def test_cluster_config_workers_train_as_the_launcher_does(digits_runs):
    from gcomp import cluster
    with cluster.LocalCluster(shards=2, workers=2, mode="near-lossless") as c:
        outs = cluster_workers(c.config_path, 2, ["--steps", "4", "--seed", "1", "--batch", "32"],
                               env_of=lambda r: {"JOB_COMPLETION_INDEX": str(r)})
    for code, out, err in outs:
        assert code == 0, out + err
    assert outs[1][1].strip() == "", "only worker 0 prints the job's line: " + outs[1][1]
    got = json.loads(outs[0][1].strip().splitlines()[-1])
    want = digits_runs["near-lossless"]
    assert set(got) == KEYS | {"test_accuracy"}
    for key in ("mode", "steps", "train_loss", "test_accuracy", "raw_bytes", "wire_bytes",
                "transport"):
        assert got[key] == want[key], (key, got, want)


@pytest.mark.parametrize("flags, env, expected", [
    (["--worker-index", "0"], {}, "--worker-index needs --cluster-config"),
    (["--cluster-config", "CONFIG"], {}, "--cluster-config needs --worker-index"),
    (["--cluster-config", "CONFIG", "--worker-index", "2", "--master", "h:1"], {},
     "worker index 2 is outside [0, 2)"),
    (["--cluster-config", "CONFIG", "--worker-index", "0"], {"MASTER_ADDR": "h"},
     "--cluster-config needs --master HOST:PORT"),
    (["--cluster-config", "CONFIG", "--master", "nowhere"], {"RANK": "0"},
     "--master 'nowhere' is not HOST:PORT"),
    (["--cluster-config", "CONFIG", "--mode", "lossless"], {"RANK": "1"},
     "--mode lossless disagrees with uplink.mode: near-lossless"),
    (["--cluster-config", "CONFIG", "--workers", "4"], {"RANK": "1"},
     "--workers 4 disagrees with workers: 2"),
    (["--cluster-config", "CONFIG", "--preset", "aggressive"], {"RANK": "0"},
     "--preset aggressive needs uplink.rel_bits: 3"),
    (["--cluster-config", "CONFIG", "--transport", "gloo"], {"RANK": "0"},
     "cannot use --transport gloo"),
    (["--cluster-config", "CONFIG"], {"JOB_COMPLETION_INDEX": "x"},
     "JOB_COMPLETION_INDEX='x' is not an integer"),
    (["--cluster-config", "MISSING"], {"RANK": "0"}, "MISSING"),
    (["--cluster-config", "CONFIG", "--master", "h:1"], {"RANK": "1", "WORLD_SIZE": "3"},
     "WORLD_SIZE=3 disagrees with workers: 2"),
])
def test_cluster_config_flags_are_checked_before_anything_starts(tmp_path, flags, env, expected):
    if not gcomp.have_extension():
        pytest.skip(gcomp.extension_error())
    from gcomp import cluster
    config = tmp_path / "cluster.json"
    config.write_text(json.dumps(cluster.cluster_config(["127.0.0.1:1", "127.0.0.1:2"], 2,
                                                        "near-lossless")))
    flags = [str(config) if f == "CONFIG" else str(tmp_path / "nope.yaml") if f == "MISSING"
             else f for f in flags]
    expected = expected.replace("MISSING", str(tmp_path / "nope.yaml"))
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "WORLD_SIZE", "JOB_COMPLETION_INDEX", "MASTER_ADDR",
                          "MASTER_PORT")}
    out = subprocess.run([sys.executable, os.path.join(HERE, "train_digits.py")] + flags,
                         capture_output=True, text=True, timeout=120, env=dict(clean, **env))
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr

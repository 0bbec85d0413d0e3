"""`python3 -m pip install ./python` into a fresh virtual environment (system site packages
for torch), offline, then an example run from outside the checkout: the installed package
brings its extension and gcomp_server, so no PYTHONPATH is needed."""
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pip_install_then_an_example_needs_no_environment(tmp_path):
    if shutil.which("bazel") is None:
        pytest.skip("no bazel on PATH (tools/bootstrap.sh installs it)")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip("python3 -m venv does not work here (python3-venv): " + made.stderr)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GCOMP_SERVER_BIN")}
    # --no-index: proves that nothing is downloaded.
    install = subprocess.run([python, "-m", "pip", "install", "--no-index",
                              os.path.join(ROOT, "python")],
                             capture_output=True, text=True, timeout=1800, env=env)
    assert install.returncode == 0, install.stdout + install.stderr

    where = subprocess.run(
        [python, "-c", "import gcomp, _gcomp; from gcomp import cluster; "
         "print(gcomp.__file__); print(_gcomp.__file__); print(cluster.server_binary())"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert where.returncode == 0, where.stderr
    for path in where.stdout.split():
        assert path.startswith(str(venv)), where.stdout

    # The examples, copied away from the checkout (their fallback to ../python is gone).
    examples = tmp_path / "examples"
    shutil.copytree(os.path.join(ROOT, "examples"), examples,
                    ignore=shutil.ignore_patterns("__pycache__", "*_test.py"))
    run = subprocess.run([python, str(examples / "train_digits.py"), "--mode", "near-lossless",
                          "--transport", "ps", "--workers", "2", "--shards", "2", "--steps", "2",
                          "--batch", "32"],
                         capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["transport"] == "ps" and result["mode"] == "near-lossless"
    assert result["ratio"] > 2.0

"""`python3 -m pip install ./python`: the gcomp package with its compiled parts.

The `_gcomp` extension and `gcomp_server` are built with Bazel in the checkout around this
folder (`bazel build //python:_gcomp.so //server:gcomp_server`, offline, from Debian's
packages: tools/bootstrap.sh installs them) and copied into the package, so installed
scripts need neither PYTHONPATH nor the checkout's bazel-bin. Nothing is downloaded: the
package has no Python dependencies (torch, numpy come from the system; use a virtual
environment made with --system-site-packages).
"""
import os
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TARGETS = {"//python:_gcomp.so": ("python/_gcomp.so", "_gcomp.so"),
           "//server:gcomp_server": ("server/gcomp_server", "gcomp/bin/gcomp_server")}


class BuildWithBazel(build_py):
    """Builds the pure-Python package, then the Bazel targets, and copies them in."""

    def run(self):
        super().run()
        bazel = shutil.which("bazel")
        if bazel is None or not os.path.exists(os.path.join(ROOT, "WORKSPACE")):
            sys.exit("gcomp setup: needs bazel and the gcomp-ps checkout around python/ "
                     "(run tools/bootstrap.sh in the checkout first)")
        subprocess.run([bazel, "build", *TARGETS], cwd=ROOT, check=True)
        bin_dir = subprocess.run([bazel, "info", "bazel-bin"], cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout.strip()
        for built, installed in TARGETS.values():
            dest = os.path.join(self.build_lib, installed)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copyfile(os.path.join(bin_dir, built), dest)
            os.chmod(dest, 0o755)


class CompiledDistribution(Distribution):
    """Tags the wheel for this platform and Python: it holds compiled code."""

    def has_ext_modules(self):
        return True


setup(
    name="gcomp",
    version="0.1.0",
    description="PyTorch client of the gcomp-ps parameter server and the GComp codec",
    packages=["gcomp"],
    python_requires=">=3.9",
    cmdclass={"build_py": BuildWithBazel},
    distclass=CompiledDistribution,
)

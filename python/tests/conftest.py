import os
import sys

# The gcomp package (python/) and the built extension (bazel-bin/python) are found from
# the checkout even without PYTHONPATH.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
for path in (os.path.join(ROOT, "python"), os.path.join(ROOT, "bazel-bin", "python")):
    if path not in sys.path:
        sys.path.insert(0, path)

"""gcomp: PyTorch client of the gcomp-ps parameter server and the GComp gradient codec.

The compiled part is the `_gcomp` extension (Bazel target //python:_gcomp.so). It is found
on sys.path, or else in the checkout's bazel-bin/python beside this package. Code that can
work without it checks `have_extension()`; `extension()` raises ImportError naming how to
build it.
"""
import importlib
import os
import sys

__all__ = ["extension", "have_extension", "extension_error", "repo_root"]

_EXT = None
_EXT_ERROR = None


def repo_root():
    """The checkout this package lives in (python/gcomp/.. /..)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load():
    global _EXT, _EXT_ERROR
    if _EXT is not None or _EXT_ERROR is not None:
        return
    try:
        _EXT = importlib.import_module("_gcomp")
        return
    except ImportError as first:
        _EXT_ERROR = first
    built = os.path.join(repo_root(), "bazel-bin", "python")
    if os.path.exists(os.path.join(built, "_gcomp.so")) and built not in sys.path:
        sys.path.append(built)
        try:
            _EXT = importlib.import_module("_gcomp")
            _EXT_ERROR = None
        except ImportError as second:
            _EXT_ERROR = second


def have_extension():
    _load()
    return _EXT is not None


def extension_error():
    """Why the extension is unavailable (a string), or None."""
    _load()
    if _EXT is not None:
        return None
    return ("the _gcomp extension is not built (bazel build //python:_gcomp.so, or "
            "python3 -m pip install ./python): %s" % _EXT_ERROR)


def extension():
    _load()
    if _EXT is None:
        raise ImportError(extension_error())
    return _EXT

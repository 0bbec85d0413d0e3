"""A local gcomp-ps cluster: S gcomp_server shard processes on loopback (placeholder until
the service lands)."""
import os

from gcomp import repo_root


def server_binary():
    return os.environ.get("GCOMP_SERVER_BIN",
                          os.path.join(repo_root(), "bazel-bin", "server", "gcomp_server"))


def server_missing():
    """None if gcomp_server can be started, else why not."""
    path = server_binary()
    if not os.access(path, os.X_OK):
        return "no gcomp_server at %s (bazel build //server:gcomp_server)" % path
    return None

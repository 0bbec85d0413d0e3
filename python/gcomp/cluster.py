"""A local gcomp-ps cluster: S real gcomp_server shard processes on loopback, and the
worker-side connection to it.

    with LocalCluster(shards=2, workers=2, mode="near-lossless") as c:
        client = connect(c.config_path, worker=0)   # in each worker process
"""
import json
import operator
import sys
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from gcomp import extension, repo_root


def server_binary():
    """GCOMP_SERVER_BIN, else the copy `pip install ./python` put in the package, else the
    checkout's bazel-bin, else gcomp_server on PATH (as in the training image)."""
    if "GCOMP_SERVER_BIN" in os.environ:
        return os.environ["GCOMP_SERVER_BIN"]
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "gcomp_server")
    if os.access(packaged, os.X_OK):
        return packaged
    built = os.path.join(repo_root(), "bazel-bin", "server", "gcomp_server")
    on_path = shutil.which("gcomp_server")
    if not os.access(built, os.X_OK) and on_path:
        return on_path
    return built


def server_missing():
    """None if gcomp_server can be started, else why not."""
    path = server_binary()
    if not os.access(path, os.X_OK):
        return "no gcomp_server at %s (bazel build //server:gcomp_server)" % path
    return None


class _PortTaken(Exception):
    """A shard could not listen: its port was taken after it was picked."""


def _free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cluster_config(shard_addresses, workers, mode, rel_bits=7, abs_log2=-16,
                   job="train", chunk_bytes=1 << 20, step_timeout_ms=120_000, **fields):
    """The cluster config (a dict, written as JSON) for one training job. The shards return
    the mean gradient (optimizer "none"); the optimizer runs on the workers. `fields` are
    further config fields (docs/SERVICE.md), each replacing the default: e.g.
    downlink={"mode": "none"}, limits={"max_tensors": 100}, max_inflight_chunks=8; the shards
    check them at start."""
    direction = {"mode": mode, "rel_bits": rel_bits, "abs_log2": abs_log2}
    config = {
        "job": job,
        "workers": workers,
        "shards": list(shard_addresses),
        "shard_map_epoch": 1,
        "chunk_bytes": chunk_bytes,
        "uplink": direction,
        "downlink": direction,
        "optimizer": {"name": "none"},
        "step_timeout_ms": step_timeout_ms,
        "rpc_timeout_ms": step_timeout_ms + 30_000,
    }
    config.update(fields)
    return config


def _listens(pid, port):
    """Whether process `pid` holds a TCP socket listening on `port` (/proc/net/tcp{,6}:
    state 0A, its inode among the process's descriptors)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    try:
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if (len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes
                            and int(fields[1].rsplit(":", 1)[1], 16) == port):
                        return True
        except OSError:
            continue
    return False


class LocalCluster:
    """Starts S gcomp_server processes on free loopback ports and stops them (SIGTERM).

    `config` takes cluster_config's keywords: job ("train"), chunk_bytes (1 MiB),
    step_timeout_ms (120000: how long a step waits for a missing worker) and any further
    config field."""

    def __init__(self, shards, workers, mode, rel_bits=7, abs_log2=-16, workdir=None,
                 start_timeout_s=30.0, **config):
        for name, value in (("shards", shards), ("workers", workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError("LocalCluster: %s must be an int of at least 1, got %r"
                                 % (name, value))
        self.shards, self.workers = shards, workers
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="gcomp-cluster-")
            workdir = self._tmp.name
        self.workdir = workdir
        self.addresses = ["127.0.0.1:%d" % p for p in _free_ports(shards)]
        self.config = cluster_config(self.addresses, workers, mode, rel_bits, abs_log2,
                                     **config)
        self.config_path = os.path.join(workdir, "cluster.json")
        self.start_timeout_s = start_timeout_s
        self.procs = []
        # Written now, so that config_path names a readable file from the start; start()
        # writes it again with any change made to `config` (and new ports, if it had to
        # pick them again).
        self._write_config()

    def _write_config(self):
        with open(self.config_path, "w") as f:
            json.dump(self.config, f, indent=1)

    def start(self):
        why = server_missing()
        if why:
            raise RuntimeError(why)
        # The ports were free when picked, but another process (a shard's metrics port, a
        # process group) can take one before its shard listens: then new ones, a few times.
        for attempt in range(4):
            try:
                return self._start_once()
            except _PortTaken as taken:
                if attempt == 3:
                    raise RuntimeError("a shard could not listen on %s, four times: Address "
                                       "already in use" % taken.args[0])
                self.addresses = ["127.0.0.1:%d" % p for p in _free_ports(self.shards)]
                self.config["shards"] = list(self.addresses)

    def _start_once(self):
        self._write_config()
        for k in range(self.shards):
            log = open(os.path.join(self.workdir, "shard%d.log" % k), "w")
            self.procs.append(subprocess.Popen(
                [server_binary(), "--config", self.config_path, "--shard", str(k),
                 "--decode_threads", "2", "--log_level", "warn",
                 # Several shards share this host: each picks a free metrics port.
                 "--metrics_address", "127.0.0.1:0",
                 "--exit_with_parent", "--parent_pid", str(os.getpid())],
                stdout=log, stderr=subprocess.STDOUT))
        deadline = time.time() + self.start_timeout_s
        for k, addr in enumerate(self.addresses):
            host, port = addr.rsplit(":", 1)
            while True:
                code = self.procs[k].poll()
                if code is not None:
                    self.stop()
                    log = os.path.join(self.workdir, "shard%d.log" % k)
                    with open(log) as f:
                        tail = f.read()[-2000:]
                    if "cannot listen on %s: Address already in use" % addr in tail:
                        raise _PortTaken(addr)
                    raise RuntimeError("shard %d exited with %d: %s" % (k, code, tail))
                # The shard's own socket, not just any listener: a port taken meanwhile by
                # another process (a shard's metrics port) also accepts connections, and
                # workers would then wait on it for no answer.
                if _listens(self.procs[k].pid, int(port)):
                    break
                if time.time() > deadline:
                    self.stop()
                    raise RuntimeError("shard %d did not listen on %s" % (k, addr))
                time.sleep(0.05)
        return self

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()


def read_config(config_path, overrides=()):
    """The cluster config at `config_path` as gcomp_server reads it (validated, defaults
    filled in), as a dict with the config's field names. Raises ValueError naming the
    problem."""
    return json.loads(extension().read_config(config_path, list(overrides)))


class WorkerClient:
    """A worker Client (the extension's `Client`: declare, push_pull, stats, close, ...)
    with the cluster config it was made from, as `config` (read_config's dict), so that
    what follows the config (ClientTransport's error feedback) needs no second copy."""

    def __init__(self, client, config, worker=None):
        self._client = client
        self.config = config
        self.worker = worker

    def __getattr__(self, name):
        return getattr(self._client, name)

    def push_pull(self, key, step, data, out=None):
        """The extension's push_pull, taking CPU torch tensors as well as numpy arrays and
        other buffers (a tensor is passed as its numpy view, without a copy)."""
        data = _buffer_of(data, writable=out is None)
        if out is not None:
            out = _buffer_of(out, writable=True)
        return self._client.push_pull(key, step, data, out)

    def pull(self, key, out):
        """The extension's pull, taking a CPU torch tensor as well."""
        return self._client.pull(key, _buffer_of(out, writable=True))


def _buffer_of(x, writable):
    """A torch tensor's numpy view (checked as the codec checks it); anything else as is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        from gcomp import codec
        return codec._as_buffer(x, writable=writable)[0]  # pylint: disable=protected-access
    return x


def connect(config_path, worker, metrics_address=""):
    """The worker Client of `worker` (0..W-1) for the cluster in `config_path`.

    With metrics_address ("host:port", port 0 picks one: see client.metrics_port()) the
    worker's Prometheus metrics are served on http://host:port/metrics."""
    try:
        index = -1 if isinstance(worker, bool) else operator.index(worker)
    except TypeError:
        index = -1
    if index < 0:
        raise ValueError("worker must be an index 0..W-1 of the job's workers, got %r"
                         % (worker,))
    config = read_config(config_path)
    global _connected_in
    if _connected_in is not None and _connected_in != os.getpid():
        raise RuntimeError(
            "gcomp.cluster.connect: this process was forked from process %d after that "
            "process had connected a Client, and gRPC does not work across fork() (the "
            "connection would hang). Start worker processes with the 'spawn' or "
            "'forkserver' start method (torch.multiprocessing.spawn, or "
            "multiprocessing.get_context('spawn')), or connect only in the children"
            % _connected_in)
    client = extension().Client(config_path, index, metrics_address=metrics_address)
    if _connected_in is None:
        _connected_in = os.getpid()
    return WorkerClient(client, config, index)


# The process whose connect() started gRPC in this interpreter's memory; a forked child
# inherits it and a differing pid says so.
_connected_in = None

#include "coord/etcd_process.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/loopback_port.h"
#include "base/spawn.h"
#include "coord/etcd_store.h"

namespace gcomp::coord {
namespace {

bool IsExecutable(const std::string& path) { return access(path.c_str(), X_OK) == 0; }

std::string FindEtcd(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* env = getenv("GCOMP_ETCD_BIN"); env != nullptr && *env != '\0') return env;
  if (const char* path = getenv("PATH")) {
    for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
      const std::string candidate = absl::StrCat(dir, "/etcd");
      if (IsExecutable(candidate)) return candidate;
    }
  }
  return "/usr/bin/etcd";
}

std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.size() > 400 ? last.substr(last.size() - 400) : last;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::Start(
    const EtcdClusterOptions& options) {
  if (options.members < 1 || options.members > 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd members must be 1 to 7, not ", options.members));
  }
  std::unique_ptr<EtcdCluster> c(new EtcdCluster());
  c->options_ = options;
  c->options_.binary = FindEtcd(options.binary);
  if (!IsExecutable(c->options_.binary)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no etcd binary at ", c->options_.binary,
        ": install Debian's etcd-server (tools/bootstrap.sh does) or set GCOMP_ETCD_BIN"));
  }
  if (c->options_.data_dir.empty()) {
    const char* tmp = getenv("TEST_TMPDIR");
    std::string templ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/gcomp-etcd-XXXXXX");
    if (mkdtemp(templ.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot make a folder like ", templ));
    }
    c->options_.data_dir = templ;
    c->own_dir_ = true;
  } else if (mkdir(c->options_.data_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot make the etcd data folder ", c->options_.data_dir));
  }
  std::vector<std::string> peers;
  for (int k = 0; k < options.members; ++k) {
    Member m;
    m.name = absl::StrCat("etcd", k);
    m.client_port = FreePort();
    m.peer_port = FreePort();
    if (m.client_port <= 0 || m.peer_port <= 0) {
      return absl::UnavailableError("no free loopback port for an etcd member");
    }
    peers.push_back(absl::StrCat(m.name, "=http://127.0.0.1:", m.peer_port));
    c->members_.push_back(m);
  }
  c->initial_cluster_ = absl::StrJoin(peers, ",");
  for (int k = 0; k < options.members; ++k) {
    if (absl::Status s = c->Spawn(k, /*initial=*/true); !s.ok()) return s;
  }
  if (absl::Status s = c->WaitReady(options.start_timeout); !s.ok()) return s;
  return c;
}

absl::Status EtcdCluster::Spawn(int k, bool initial) {
  Member& m = members_[k];
  const std::string dir = absl::StrCat(options_.data_dir, "/", m.name);
  const std::string client = absl::StrCat("http://", options_.host, ":", m.client_port);
  const std::string peer = absl::StrCat("http://127.0.0.1:", m.peer_port);
  std::vector<std::string> args = {
      options_.binary,
      "--name", m.name,
      "--data-dir", dir,
      "--listen-client-urls", client,
      "--advertise-client-urls", client,
      "--listen-peer-urls", peer,
      "--initial-advertise-peer-urls", peer,
      "--initial-cluster", initial_cluster_,
      "--initial-cluster-state", initial ? "new" : "existing",
      "--initial-cluster-token", absl::StrCat("gcomp-", getpid()),
      // Loopback members: elections in well under a second, as the leases expect.
      "--heartbeat-interval", "100",
      "--election-timeout", "1000",
      "--log-level", "warn",
  };
  const std::string log = absl::StrCat(options_.data_dir, "/", m.name, ".log");
  m.pid = gcomp::Spawn(args, log, log);
  if (m.pid <= 0) return absl::InternalError("fork failed starting etcd");
  return absl::OkStatus();
}

absl::Status EtcdCluster::WaitReady(absl::Duration timeout) const {
  EtcdStoreOptions so;
  so.endpoints = endpoints();
  so.request_timeout = absl::Milliseconds(500);
  const absl::Time deadline = absl::Now() + timeout;
  absl::Status last;
  while (absl::Now() < deadline) {
    for (const Member& m : members_) {
      int status = 0;
      if (m.pid > 0 && waitpid(m.pid, &status, WNOHANG) == m.pid) {
        const std::string log = absl::StrCat(options_.data_dir, "/", m.name, ".log");
        return absl::UnavailableError(absl::StrCat("etcd member ", m.name, " exited (status ",
                                                   status, "): ", LastLine(log)));
      }
    }
    // New channels each time: a channel refused before the member listened waits out
    // gRPC's reconnect backoff. A write goes through the leader: the cluster has a quorum.
    absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Create(so);
    if (!store.ok()) return store.status();
    Txn txn;
    txn.puts.push_back({"/gcomp-ready", "1", kNoLease});
    absl::StatusOr<TxnResult> r = (*store)->Commit(txn);
    if (r.ok()) return absl::OkStatus();
    last = r.status();
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::UnavailableError(absl::StrCat("etcd did not answer within ",
                                             absl::FormatDuration(timeout), ": ", last.message(),
                                             " (logs in ", options_.data_dir, ")"));
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& m : members_) out.push_back(absl::StrCat(options_.host, ":", m.client_port));
  return out;
}

void EtcdCluster::Kill(int k) {
  Member& m = members_[k];
  if (m.pid <= 0) return;
  kill(m.pid, SIGCONT);  // a paused member dies too
  kill(m.pid, SIGKILL);
  waitpid(m.pid, nullptr, 0);
  m.pid = -1;
}

absl::Status EtcdCluster::Restart(int k) {
  Kill(k);
  return Spawn(k, /*initial=*/false);
}

void EtcdCluster::Pause(int k) {
  if (members_[k].pid > 0) kill(members_[k].pid, SIGSTOP);
}

void EtcdCluster::Resume(int k) {
  if (members_[k].pid > 0) kill(members_[k].pid, SIGCONT);
}

EtcdCluster::~EtcdCluster() {
  for (int k = 0; k < members(); ++k) Kill(k);
  std::error_code ignored;  // a folder left behind in the temporary folder is harmless
  if (own_dir_) std::filesystem::remove_all(options_.data_dir, ignored);
}

}  // namespace gcomp::coord

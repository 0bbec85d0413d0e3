// A local etcd cluster of 1 to N members on loopback, each a real `etcd` process (Debian's
// etcd-server, which tools/bootstrap.sh installs): the local launcher's and the tests'
// store. Members can be stopped, paused and started again to inject faults. Not
// thread-safe; the destructor kills every member and removes the data directory.
#ifndef GCOMP_COORD_ETCD_PROCESS_H_
#define GCOMP_COORD_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gcomp::coord {

struct EtcdClusterOptions {
  int members = 1;
  // Where each member keeps its data (a folder per member); empty: a new temporary folder,
  // removed at the end.
  std::string data_dir;
  // The etcd binary; empty: $GCOMP_ETCD_BIN, else `etcd` on PATH, else /usr/bin/etcd.
  std::string binary;
  // The address every member serves clients on (and advertises): loopback by default; a
  // host's own non-loopback address where clients in another network namespace must reach
  // it (the fault harness's partitioned shard).
  std::string host = "127.0.0.1";
  // Each member's log goes to <data_dir>/member<K>.log.
  // How long Start waits for every member to answer.
  absl::Duration start_timeout = absl::Seconds(30);
};

class EtcdCluster {
 public:
  // Starts every member on free loopback ports and waits until the cluster answers a read.
  // FailedPrecondition naming the package when the binary is missing; Unavailable with the
  // member's last log line when it does not come up.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(const EtcdClusterOptions& options);
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // host:port of every member's client URL, for EtcdStoreOptions::endpoints.
  std::vector<std::string> endpoints() const;
  int members() const { return static_cast<int>(members_.size()); }
  pid_t pid(int member) const { return members_[member].pid; }

  // SIGKILL of one member (its data stays); Restart starts it again on the same ports and
  // data. SIGSTOP / SIGCONT pause and resume it.
  void Kill(int member);
  absl::Status Restart(int member);
  void Pause(int member);
  void Resume(int member);

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };
  EtcdCluster() = default;
  absl::Status Spawn(int member, bool initial);
  absl::Status WaitReady(absl::Duration timeout) const;

  EtcdClusterOptions options_;
  bool own_dir_ = false;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_ETCD_PROCESS_H_

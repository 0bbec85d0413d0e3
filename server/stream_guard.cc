#include "server/stream_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // TCP_INFO with tcpi_bytes_received (glibc's lacks it)
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "grpc/grpc.h"
#include "grpc/support/alloc.h"

namespace gcomp::server {
namespace {

// gRPC's channelz JSON for one call, freed with gpr_free.
std::string Take(char* json) {
  if (json == nullptr) return "";
  std::string s(json);
  gpr_free(json);
  return s;
}

// The number after `key` in `json` from `from` on ("key":"123" or "key":123); 0 where the
// key is absent (channelz leaves zero counters out).
int64_t NumberAfter(const std::string& json, const std::string& key, size_t from = 0) {
  const size_t at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos) return 0;
  size_t p = at + key.size() + 3;
  if (p < json.size() && json[p] == '"') ++p;
  size_t end = p;
  while (end < json.size() && json[end] >= '0' && json[end] <= '9') ++end;
  int64_t v = 0;
  return absl::SimpleAtoi(absl::string_view(json).substr(p, end - p), &v) ? v : 0;
}

// Every (socketId, name) of the server sockets listed in `json`: each in an object of its
// own, {"socketId":"3","name":"chttp2 ipv4:..."} in either order.
std::vector<std::pair<int64_t, std::string>> SocketRefs(const std::string& json) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (size_t id = json.find("\"socketId\":"); id != std::string::npos;
       id = json.find("\"socketId\":", id + 1)) {
    const size_t begin = json.rfind('{', id);
    const size_t end = json.find('}', id);
    if (begin == std::string::npos || end == std::string::npos) break;
    const std::string object = json.substr(begin, end - begin);
    const size_t name = object.find("\"name\":\"");
    std::string name_value;
    if (name != std::string::npos) {
      const size_t name_end = object.find('"', name + 8);
      if (name_end != std::string::npos) name_value = object.substr(name + 8, name_end - name - 8);
    }
    out.emplace_back(NumberAfter(object, "socketId"), std::move(name_value));
  }
  return out;
}

// Bytes gRPC has read from TCP socket `fd`: what the kernel took in (TCP_INFO) less what
// still waits in its receive queue, so that a shard too busy to read does not count what a
// peer sent meanwhile against the streams gRPC has seen. 0 where the kernel cannot say.
uint64_t BytesRead(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  int queued = 0;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received) ||
      ioctl(fd, FIONREAD, &queued) != 0) {
    return 0;
  }
  return info.tcpi_bytes_received - std::min<uint64_t>(info.tcpi_bytes_received, queued);
}

log::LineBudget* ClosedLines() {
  static log::LineBudget* const budget = new log::LineBudget(10, "stream-limit closures");
  return budget;
}

}  // namespace

bool PeerOfSocket(int fd, std::string* peer, int* local_port) {
  sockaddr_storage remote{}, local{};
  socklen_t rlen = sizeof(remote), llen = sizeof(local);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &rlen) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) {
    return false;
  }
  char ip[INET6_ADDRSTRLEN] = {};
  if (remote.ss_family == AF_INET) {
    const auto* r = reinterpret_cast<const sockaddr_in*>(&remote);
    inet_ntop(AF_INET, &r->sin_addr, ip, sizeof(ip));
    *peer = absl::StrCat("ipv4:", ip, ":", ntohs(r->sin_port));
  } else if (remote.ss_family == AF_INET6) {
    const auto* r = reinterpret_cast<const sockaddr_in6*>(&remote);
    if (IN6_IS_ADDR_V4MAPPED(&r->sin6_addr)) {
      // An IPv4 client of a dual-stack ([::]) listener: gRPC names it by its IPv4 address.
      inet_ntop(AF_INET, &r->sin6_addr.s6_addr[12], ip, sizeof(ip));
      *peer = absl::StrCat("ipv4:", ip, ":", ntohs(r->sin6_port));
    } else {
      // gRPC writes the host as a URI path: brackets (and a zone's '%') percent-encoded,
      // "ipv6:%5B::1%5D:51234".
      inet_ntop(AF_INET6, &r->sin6_addr, ip, sizeof(ip));
      std::string host = ip;
      if (r->sin6_scope_id != 0) absl::StrAppend(&host, "%25", r->sin6_scope_id);
      *peer = absl::StrCat("ipv6:%5B", host, "%5D:", ntohs(r->sin6_port));
    }
  } else {
    return false;
  }
  *local_port = local.ss_family == AF_INET
                    ? ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port)
                    : ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
  return true;
}

bool ByteCredit::Look(int64_t started, int64_t open, uint64_t read) {
  open = std::max<int64_t>(0, open);
  if (!looked_) {
    looked_ = true;
    started_ = started;
    read_ = read;
    credit_ = (open + kSlackStreams) * per_stream_;
    return false;
  }
  const int64_t new_streams = std::max<int64_t>(0, started - started_);
  const int64_t bytes = read > read_ ? static_cast<int64_t>(read - read_) : 0;
  started_ = std::max(started_, started);
  read_ = std::max(read_, read);
  credit_ += new_streams * per_stream_ - bytes;
  overdrawn_ = credit_ < 0 ? overdrawn_ + 1 : 0;
  credit_ = std::min(credit_, (open + kSlackStreams) * per_stream_);
  return overdrawn_ >= 2;
}

StreamGuard::~StreamGuard() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void StreamGuard::Track(int fd, uint32_t max_open_streams) {
  std::string peer;
  int local_port = 0;
  if (!PeerOfSocket(fd, &peer, &local_port)) return;
  absl::MutexLock lock(&mu_);
  tracked_.insert_or_assign(peer,
                            Tracked{fd, local_port, max_open_streams,
                                    ByteCredit(options_.max_message_bytes + (uint64_t{64} << 10))});
}

absl::Status StreamGuard::Admit(int fd) {
  std::string peer;
  int local_port = 0;
  if (!PeerOfSocket(fd, &peer, &local_port)) return absl::OkStatus();
  const std::string address = AddressOfPeer(peer);
  absl::Duration left;
  {
    absl::MutexLock lock(&mu_);
    left = refusals_.RefusedFor(address, absl::Now());
    if (left <= absl::ZeroDuration()) return absl::OkStatus();
    ++refused_;
  }
  if (options_.on_refused) options_.on_refused();
  return absl::ResourceExhaustedError(absl::StrCat(
      "address ", log::Clip(address, 64), " is refused for another ",
      absl::FormatDuration(absl::Ceil(left, absl::Milliseconds(1))),
      ": a connection of it was closed for more HTTP/2 streams open than allowed or for a flood "
      "of frames that carry no request"));
}

void StreamGuard::Start() {
  thread_ = std::thread([this] {
    while (true) {
      absl::Duration wait;
      {
        absl::MutexLock lock(&mu_);
        wait = std::max(options_.every,
                        options_.per_connection * static_cast<int64_t>(tracked_.size()));
      }
      if (stop_.WaitForNotificationWithTimeout(wait)) return;
      Sweep();
    }
  });
}

size_t StreamGuard::Sweep() {
  // Connections gone (closed by gRPC, the descriptor maybe reused) are dropped first.
  {
    absl::MutexLock lock(&mu_);
    refusals_.Forget(absl::Now());
    for (auto it = tracked_.begin(); it != tracked_.end();) {
      auto next = std::next(it);
      std::string peer;
      int local_port = 0;
      if (!PeerOfSocket(it->second.fd, &peer, &local_port) || peer != it->first ||
          local_port != it->second.local_port) {
        tracked_.erase(it);
      }
      it = next;
    }
    if (tracked_.empty()) return 0;
  }
  size_t shut = 0;
  const std::string servers = Take(grpc_channelz_get_servers(0));
  for (size_t p = servers.find("\"serverId\":\""); p != std::string::npos;
       p = servers.find("\"serverId\":\"", p + 1)) {
    const int64_t server = NumberAfter(servers, "serverId", p);
    for (int64_t start = 0;;) {
      const std::string page = Take(grpc_channelz_get_server_sockets(server, start, 500));
      const auto refs = SocketRefs(page);
      for (const auto& [id, name] : refs) {
        start = std::max(start, id + 1);
        const std::string peer = name.rfind("chttp2 ", 0) == 0 ? name.substr(7) : name;
        int fd = -1, local_port = 0;
        {
          absl::MutexLock lock(&mu_);
          auto it = tracked_.find(peer);
          if (it == tracked_.end()) continue;
          fd = it->second.fd;
          local_port = it->second.local_port;
        }
        const std::string socket = Take(grpc_channelz_get_socket(id));
        const size_t local = socket.find("\"local\":");
        if (local == std::string::npos || NumberAfter(socket, "port", local) != local_port) {
          continue;  // a connection of another server in this process
        }
        const int64_t started = NumberAfter(socket, "streamsStarted");
        const int64_t open =
            started - NumberAfter(socket, "streamsSucceeded") - NumberAfter(socket, "streamsFailed");
        // Two system calls a connection: only where the byte check is on.
        const uint64_t received = options_.max_message_bytes != 0 ? BytesRead(fd) : 0;
        std::string why;
        bool refuse = false;
        {
          absl::MutexLock lock(&mu_);
          auto it = tracked_.find(peer);
          if (it == tracked_.end() || it->second.fd != fd) continue;
          Tracked& now = it->second;
          if (open > now.max_open_streams) {
            why = absl::StrCat(open, " streams open, at most ", now.max_open_streams,
                               " (a peer that ignores the server's "
                               "SETTINGS_MAX_CONCURRENT_STREAMS or resets streams faster than "
                               "the shard takes them)");
            refuse = true;
          } else if (options_.max_message_bytes != 0 && now.credit.Look(started, open, received)) {
            why = absl::StrCat("more bytes read than its ", started,
                               " streams could carry, at two looks in a row (a flood of frames "
                               "that carry no request)");
          }
          if (why.empty()) continue;
          // Shut down, not closed: the descriptor stays gRPC's, which sees the end of it.
          shutdown(fd, SHUT_RDWR);
          tracked_.erase(it);
          ++closed_;
          // Only a stream flood, which reconnects at once, costs the address: too many
          // bytes may be one client's oversized message, and other clients (a NAT, a mesh
          // sidecar, a local job) share its address.
          if (refuse) refusals_.Refuse(AddressOfPeer(peer), absl::Now());
        }
        ++shut;
        if (ClosedLines()->Admit()) {
          log::Warn("connection from {} closed: {}{}", log::Clip(peer, 64), why,
                    refuse ? "; its address is refused new connections for a while" : "");
        }
      }
      if (refs.empty() || page.find("\"end\":true") != std::string::npos) break;
    }
  }
  if (shut != 0 && options_.on_closed) options_.on_closed(shut);
  return shut;
}

uint64_t StreamGuard::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

uint64_t StreamGuard::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

}  // namespace gcomp::server

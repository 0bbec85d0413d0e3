// A plain HTTP/1.0 GET against 127.0.0.1 for tests of the /metrics endpoints: the whole
// response (status line, headers, body), or "" when nothing listens on the port.
#ifndef GCOMP_BASE_TESTING_HTTP_GET_H_
#define GCOMP_BASE_TESTING_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace gcomp::testing {

inline std::string HttpGet(int port, const std::string& path = "/metrics") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  (void)!send(fd, request.data(), request.size(), MSG_NOSIGNAL);  // no SIGPIPE if refused
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
  close(fd);
  return response;
}

}  // namespace gcomp::testing

#endif  // GCOMP_BASE_TESTING_HTTP_GET_H_

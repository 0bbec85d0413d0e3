// Everything a test's code writes to file descriptor 2 while a body runs, for tests of what
// a process logs. Not thread-safe: nothing else may redirect stderr meanwhile.
#ifndef GCOMP_BASE_TESTING_CAPTURE_STDERR_H_
#define GCOMP_BASE_TESTING_CAPTURE_STDERR_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace gcomp::testing {

// Runs `body` with stderr sent to a file under $TEST_TMPDIR; returns what it wrote.
template <typename Body>
std::string CaptureStderr(Body body) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/stderr.txt";
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, 2);
  close(fd);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace gcomp::testing

#endif  // GCOMP_BASE_TESTING_CAPTURE_STDERR_H_

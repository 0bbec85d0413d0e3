#include "base/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>

namespace gcomp {

pid_t Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  // A launcher killed by a signal must not leave its shards and workers running.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(o, 1);
  dup2(e, 2);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  perror("exec");
  _exit(127);
}

}  // namespace gcomp

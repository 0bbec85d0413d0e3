// Starting a child process whose output goes to files (the local launcher's shards and
// workers, local etcd members).
#ifndef GCOMP_BASE_SPAWN_H_
#define GCOMP_BASE_SPAWN_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace gcomp {

// Starts `args` (args[0] looked up on PATH) with stdout and stderr in files; its pid, or -1
// when fork fails. The child gets SIGTERM when the *thread* that called Spawn exits
// (PR_SET_PDEATHSIG follows the forking thread, not the process), so a thread that starts
// long-lived children must outlive them.
pid_t Spawn(const std::vector<std::string>& args, const std::string& out, const std::string& err);

}  // namespace gcomp

#endif  // GCOMP_BASE_SPAWN_H_

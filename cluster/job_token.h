// The job token of docs/SERVICE.md, "Security": a secret in a file (security.token_file)
// that workers send on every call as "authorization: Bearer <token>" and shards check on
// every call but grpc.health.v1. The file holds one token per line, at most kMaxTokens:
// clients send the first, shards accept any, so a token is rotated without a window in
// which either side refuses the other (docs/DEPLOY.md, "Rotate the job token").
//
//   absl::StatusOr<std::shared_ptr<JobToken>> token = JobToken::Load(path);
//   ctx.AddMetadata("authorization", (*token)->Header());        // client
//   absl::Status s = (*token)->Check(values_of_authorization);     // shard
//
// The file is re-read when it changes on disk (a Kubernetes Secret update swaps it), checked
// at most once per `recheck` interval; a file that cannot be read or is empty on a re-read
// keeps the last good token. No message, log line or status this class makes contains the
// token. Thread-safe.
#ifndef GCOMP_CLUSTER_JOB_TOKEN_H_
#define GCOMP_CLUSTER_JOB_TOKEN_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace gcomp::cluster {

class JobToken {
 public:
  static constexpr size_t kMaxTokens = 4;

  // Reads the tokens at `path`, one per line, each trimmed of surrounding whitespace (blank
  // lines skipped). NotFound if the file cannot be read; FailedPrecondition if it holds no
  // token, more than kMaxTokens, or characters that cannot go in a header (anything but
  // printable ASCII without spaces; the line is named, never echoed). Errors name the
  // config field security.token_file and the path.
  static absl::StatusOr<std::shared_ptr<JobToken>> Load(const std::string& path,
                                                        absl::Duration recheck = absl::Seconds(1));

  // The value of the authorization header: "Bearer <the file's first token>".
  std::string Header();

  // Checks the authorization header values of one call: OK when one of them is
  // "Bearer <any token of the file>" (compared in time independent of where it differs
  // and of which token matched); Unauthenticated
  // when there is none or none is a Bearer token; PermissionDenied when the token is not
  // this job's.
  absl::Status Check(const std::vector<absl::string_view>& authorization);

  const std::string& path() const { return path_; }

 private:
  // What identifies one version of the file (a rename over it changes the inode).
  struct FileVersion {
    ino_t inode = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileVersion& o) const {
      return inode == o.inode && size == o.size && mtime_ns == o.mtime_ns;
    }
  };

  JobToken(std::string path, absl::Duration recheck) : path_(std::move(path)), recheck_(recheck) {}
  static absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path);
  static absl::StatusOr<FileVersion> Stat(const std::string& path);
  // The current tokens (never empty), re-read first if the file changed and `recheck` has
  // passed.
  std::vector<std::string> Current();

  const std::string path_;
  const absl::Duration recheck_;
  absl::Mutex mu_;
  std::vector<std::string> tokens_ ABSL_GUARDED_BY(mu_);
  FileVersion version_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
  // The last re-read error logged, so a broken file is reported once, not per call.
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// Equal contents, in time that depends only on the lengths.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_JOB_TOKEN_H_

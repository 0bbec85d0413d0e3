#include "cluster/job_token.h"

#include <sys/stat.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/logging.h"

namespace gcomp::cluster {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

std::string Where(const std::string& path) {
  return absl::StrCat("security.token_file '", path, "'");
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is visited whatever `a` holds, so the time tells nothing about where
  // a guess first differs.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= x ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

absl::StatusOr<std::vector<std::string>> JobToken::ReadTokens(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) {
    return absl::NotFoundError(absl::StrCat(Where(path), ": cannot be read"));
  }
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(*bytes, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    for (char c : line) {
      if (c <= 0x20 || c >= 0x7f) {
        return absl::FailedPreconditionError(
            absl::StrCat(Where(path), ": line ", line_number,
                         ": a token may hold only printable ASCII characters without spaces"));
      }
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(Where(path), ": the file is empty"));
  }
  if (tokens.size() > kMaxTokens) {
    return absl::FailedPreconditionError(
        absl::StrCat(Where(path), ": ", tokens.size(), " tokens; at most ", kMaxTokens,
                     " (the one sent, and those accepted during a rotation)"));
  }
  return tokens;
}

absl::StatusOr<JobToken::FileVersion> JobToken::Stat(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(Where(path), ": cannot be read"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(Where(path), ": not a regular file"));
  }
  FileVersion v;
  v.inode = st.st_ino;
  v.size = st.st_size;
  v.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return v;
}

absl::StatusOr<std::shared_ptr<JobToken>> JobToken::Load(const std::string& path,
                                                         absl::Duration recheck) {
  if (path.empty()) return absl::InvalidArgumentError("security.token_file: empty path");
  absl::StatusOr<FileVersion> version = Stat(path);
  if (!version.ok()) return version.status();
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path);
  if (!tokens.ok()) return tokens.status();
  std::shared_ptr<JobToken> t(new JobToken(path, recheck));
  absl::MutexLock lock(&t->mu_);
  t->tokens_ = *std::move(tokens);
  t->version_ = *version;
  t->checked_ = absl::Now();
  return t;
}

std::vector<std::string> JobToken::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < recheck_) return tokens_;
  checked_ = now;
  absl::StatusOr<FileVersion> version = Stat(path_);
  if (version.ok() && *version == version_) return tokens_;
  absl::StatusOr<std::vector<std::string>> tokens =
      version.ok() ? ReadTokens(path_) : absl::StatusOr<std::vector<std::string>>(version.status());
  if (!tokens.ok()) {
    if (last_error_ != tokens.status().message()) {
      last_error_ = std::string(tokens.status().message());
      log::Warn("{}; keeping the tokens read before", last_error_);
    }
    return tokens_;
  }
  last_error_.clear();
  if (*tokens != tokens_) {
    log::Info("{}: the tokens changed, using the new ones ({} accepted)", Where(path_),
              tokens->size());
  }
  tokens_ = *std::move(tokens);
  version_ = *version;
  return tokens_;
}

std::string JobToken::Header() { return absl::StrCat(kBearer, Current().front()); }

absl::Status JobToken::Check(const std::vector<absl::string_view>& authorization) {
  const std::vector<std::string> tokens = Current();
  bool bearer = false;
  for (absl::string_view value : authorization) {
    // RFC 6750 lets the scheme name be in any case.
    if (value.size() < kBearer.size() ||
        !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
      continue;
    }
    bearer = true;
    const absl::string_view sent = absl::StripAsciiWhitespace(value.substr(kBearer.size()));
    // Every accepted token is compared, so the time does not say which one matched.
    bool match = false;
    for (const std::string& token : tokens) match |= ConstantTimeEquals(sent, token);
    if (match) return absl::OkStatus();
  }
  if (!bearer) {
    return absl::UnauthenticatedError(
        "no job token: send \"authorization: Bearer <token>\" (security.token_file)");
  }
  return absl::PermissionDeniedError("the job token is not this job's");
}

}  // namespace gcomp::cluster

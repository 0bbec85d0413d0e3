// Processes, ports and files of the local cluster launcher (deploy/local/cluster_main.cc).
#include "deploy/local/launcher_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/json.h"
#include "base/utf8.h"
#include "base/usage_trend.h"

namespace gcomp::launcher {

absl::StatusOr<std::vector<ReshardEvent>> ParseReshardAt(const std::vector<std::string>& entries,
                                                         int steps) {
  std::vector<ReshardEvent> events;
  for (const std::string& e : entries) {
    std::vector<std::string> parts = absl::StrSplit(e, ':');
    ReshardEvent ev;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &ev.step) ||
        !absl::SimpleAtoi(parts[1], &ev.shards) || ev.step < 1 || ev.step >= steps ||
        ev.shards < 1 || (!events.empty() && ev.step <= events.back().step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected STEP:SHARDS with 1 <= STEP < --steps, SHARDS >= 1, steps "
                       "rising; got '", e, "'"));
    }
    events.push_back(ev);
  }
  return events;
}

bool Exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0;
}

std::string FindBinary(const std::string& flag, const std::string& rel, const char* argv0) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
  for (const char* env : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* d = getenv(env)) candidates.push_back(absl::StrCat(d, "/gcomp_ps/", rel));
  }
  candidates.push_back(absl::StrCat(argv0, ".runfiles/gcomp_ps/", rel));
  std::string dir(argv0);
  dir = dir.substr(0, dir.rfind('/') + 1);
  candidates.push_back(dir + "../../" + rel);
  for (const std::string& c : candidates) {
    if (Exists(c)) return c;
  }
  return rel;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string WhyFromLog(const std::string& log, size_t max_bytes) {
  absl::string_view last_error, last;
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipWhitespace())) {
    last = line;
    // base/logging's format: "<time> E <name>] <text>"; the text is what tells.
    const size_t space = line.find(' ');
    if (space == absl::string_view::npos || line.substr(space, 3) != " E ") continue;
    const size_t text = line.find("] ", space);
    last_error = text == absl::string_view::npos ? line : line.substr(text + 2);
  }
  const absl::string_view why = last_error.empty() ? last : last_error;
  return std::string(Utf8Prefix(absl::StripAsciiWhitespace(why), max_bytes));
}

std::optional<std::string> Field(const std::string& json, const std::string& key) {
  const std::string k = absl::StrCat("\"", key, "\":");
  size_t p = json.find(k);
  if (p == std::string::npos) return std::nullopt;
  p += k.size();
  if (json[p] == '"') {
    size_t e = p + 1;
    while (e < json.size() && !(json[e] == '"' && json[e - 1] != '\\')) ++e;
    return json.substr(p + 1, e - p - 1);
  }
  if (json[p] == '[') return json.substr(p + 1, json.find(']', p) - p - 1);
  size_t e = json.find_first_of(",}", p);
  return json.substr(p, e - p);
}

double Num(const std::string& json, const std::string& key) {
  double v = 0;
  if (auto f = Field(json, key)) (void)absl::SimpleAtod(*f, &v);
  return v;
}

std::optional<Progress> ReadProgress(const std::string& path) {
  std::vector<std::string> words =
      absl::StrSplit(ReadFile(path), absl::ByAnyChar(" \n"), absl::SkipEmpty());
  Progress p;
  if (words.size() != 3 || !absl::SimpleAtoi(words[0], &p.steps) ||
      !absl::SimpleAtoi(words[1], &p.raw_bytes) || !absl::SimpleAtoi(words[2], &p.wire_bytes)) {
    return std::nullopt;
  }
  return p;
}

std::string Escape(const std::string& s) {
  const std::string quoted = JsonQuote(s);
  return quoted.substr(1, quoted.size() - 2);
}

WorkerResults ReadWorkerResults(const std::string& dir, const std::vector<int>& wait_status,
                                int steps) {
  WorkerResults r;
  r.steps = steps;
  for (size_t w = 0; w < wait_status.size(); ++w) {
    const std::string out = ReadFile(absl::StrCat(dir, "/worker", w, ".json"));
    if (out.find("\"worker\"") == std::string::npos) {
      r.ok = false;
      if (r.first_error.empty()) {
        r.first_error = absl::StrCat("worker-", w, " died (wait status ", wait_status[w], ")");
      }
      continue;
    }
    if (Field(out, "ok") != "true") r.ok = false;
    if (Field(out, "bound_ok") != "true") r.bound_ok = false;
    if (Field(out, "bound_checked") == "true") r.bound_checked = true;
    const std::string e = Field(out, "error").value_or("");
    if (!e.empty() && r.first_error.empty()) r.first_error = absl::StrCat("worker-", w, ": ", e);
    const std::string d = Field(out, "digest").value_or("");
    if (r.digest.empty()) r.digest = d;
    if (d != r.digest) r.identical = false;
    r.raw_bytes += Num(out, "raw_bytes");
    r.wire_bytes += Num(out, "wire_bytes");
    r.max_abs_error = std::max(r.max_abs_error, Num(out, "max_abs_error"));
    r.steps = std::min(r.steps, static_cast<int>(Num(out, "steps")));
    for (absl::string_view v :
         absl::StrSplit(Field(out, "step_ms").value_or(""), ',', absl::SkipEmpty())) {
      double x = 0;
      if (absl::SimpleAtod(v, &x)) r.step_ms.push_back(x);
    }
  }
  return r;
}

bool CheckSoak(const std::vector<SoakTrack>& tracks, int from_step, double max_growth_pct,
               std::string* json, std::string* first_error) {
  bool ok = true;
  double rss_growth = 0, fd_growth = 0, rss_peak_growth = 0;
  for (const SoakTrack& t : tracks) {
    if (t.samples.size() < 2) {
      ok = false;
      if (first_error->empty()) {
        *first_error = absl::StrCat("soak check: fewer than two samples of ", t.name,
                                    " at or after step ", from_step);
      }
      continue;
    }
    const UsageTrend trend = MeasureUsageTrend(t.samples);
    rss_growth = std::max(rss_growth, trend.rss_growth_pct);
    fd_growth = std::max(fd_growth, trend.fd_growth_pct);
    rss_peak_growth = std::max(rss_peak_growth, trend.rss_peak_growth_pct);
    constexpr double kMiB = 1048576.0;
    fprintf(stderr,
            "soak %-9s rss %7.1f -> %7.1f MiB (%+.2f%%, medians of %zu of %zu samples; peaks "
            "%.1f -> %.1f %+.2f%%; single %.1f -> %.1f)  fds %lu -> %lu (%+.2f%%)\n",
            t.name.c_str(), trend.first_median.rss_bytes / kMiB,
            trend.last_median.rss_bytes / kMiB, trend.rss_growth_pct, trend.window,
            trend.samples, trend.first_max.rss_bytes / kMiB, trend.last_max.rss_bytes / kMiB,
            trend.rss_peak_growth_pct, trend.first.rss_bytes / kMiB, trend.last.rss_bytes / kMiB,
            static_cast<unsigned long>(trend.first_median.open_fds),
            static_cast<unsigned long>(trend.last_median.open_fds), trend.fd_growth_pct);
  }
  if (rss_growth > max_growth_pct || fd_growth > max_growth_pct) ok = false;
  *json = absl::StrFormat(",\"soak_from_step\":%d,\"rss_growth_pct\":%.3f,"
                          "\"fd_growth_pct\":%.3f,\"soak_ok\":%s,"
                          "\"rss_peak_growth_pct\":%.3f",
                          from_step, rss_growth, fd_growth, ok ? "true" : "false",
                          rss_peak_growth);
  return ok;
}

std::string BaselineDigest(int argc, char** argv, const std::vector<std::string>& drop,
                           std::string* error) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    const bool dropped = std::any_of(drop.begin(), drop.end(), [&](const std::string& flag) {
      return a == flag || absl::StartsWith(a, flag + "=");
    });
    if (dropped) {
      if (a.find('=') == std::string::npos) ++i;  // "--flag value"
      continue;
    }
    args.push_back(a);
  }
  args.push_back("--label=fixed-shards baseline");
  args.push_back("--progress=never");
  char tmpl[] = "/tmp/gcomp_baseline_XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const pid_t child = Spawn(args, dir + "/out.json", dir + "/err.log");
  int st = 0;
  waitpid(child, &st, 0);
  const std::string out = ReadFile(dir + "/out.json");
  const std::string digest = Field(out, "digest").value_or("");
  if (digest.empty()) *error = out + ReadFile(dir + "/err.log");
  if (system(absl::StrCat("rm -rf '", dir, "'").c_str()) != 0) {
    fprintf(stderr, "cluster: could not remove %s\n", dir.c_str());
  }
  return digest;
}

}  // namespace gcomp::launcher

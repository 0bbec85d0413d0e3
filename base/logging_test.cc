#include "base/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/testing/capture_stderr.h"
#include "base/utf8.h"
#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(InitLogging, RejectsUnknownLevelByName) {
  const absl::Status status = InitLogging("logging_test_bad", "verbose");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("verbose"), absl::string_view::npos);
}

TEST(InitLogging, RejectsUnknownFormatByName) {
  const absl::Status status = InitLogging("logging_test_bad", "info", "xml");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("xml"), absl::string_view::npos);
}

TEST(InitLogging, AcceptsKnownLevelAndLogs) {
  ASSERT_TRUE(InitLogging("logging_test", "debug").ok());
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  log::Info("value {} and {}", 1, "two");  // must compile and not throw
}

using testing::CaptureStderr;

// A strict reader for the flat objects of string values the JSON format writes: returns
// the fields, or nothing if `line` is not exactly such an object (so a stray quote, a raw
// control character or trailing text fails the test). \uXXXX is decoded to UTF-8
// (surrogate pairs are not needed here and are rejected).
std::optional<std::map<std::string, std::string>> ParseFlatJsonObject(const std::string& line) {
  size_t i = 0;
  auto string_at = [&](std::string* out) -> bool {
    if (i >= line.size() || line[i] != '"') return false;
    ++i;
    while (i < line.size() && line[i] != '"') {
      const unsigned char c = line[i];
      if (c < 0x20) return false;
      if (c != '\\') {
        out->push_back(line[i++]);
        continue;
      }
      if (++i >= line.size()) return false;
      const char e = line[i++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'n': out->push_back('\n'); break;
        case 't': out->push_back('\t'); break;
        case 'r': out->push_back('\r'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'u': {
          if (i + 4 > line.size()) return false;
          const unsigned cp = std::stoul(line.substr(i, 4), nullptr, 16);
          i += 4;
          if (!AppendUtf8(cp, out)) return false;  // a lone surrogate
          break;
        }
        default:
          return false;
      }
    }
    if (i >= line.size()) return false;
    ++i;  // closing quote
    return true;
  };
  std::map<std::string, std::string> fields;
  if (line.empty() || line[i++] != '{') return std::nullopt;
  while (true) {
    std::string key, value;
    if (!string_at(&key) || i >= line.size() || line[i++] != ':' || !string_at(&value)) {
      return std::nullopt;
    }
    fields[key] = value;
    if (i >= line.size()) return std::nullopt;
    const char next = line[i++];
    if (next == '}') break;
    if (next != ',') return std::nullopt;
  }
  if (i != line.size()) return std::nullopt;
  return fields;
}

TEST(ParseFlatJsonObject, RejectsWhatIsNotOneObject) {
  EXPECT_TRUE(ParseFlatJsonObject(R"({"a":"b","c":"d\"e"})").has_value());
  EXPECT_FALSE(ParseFlatJsonObject(R"({"a":"b"c"})").has_value());
  EXPECT_FALSE(ParseFlatJsonObject("{\"a\":\"b\nc\"}").has_value());
  EXPECT_FALSE(ParseFlatJsonObject(R"({"a":"b"} )").has_value());
  EXPECT_FALSE(ParseFlatJsonObject(R"({"a":"b\q"})").has_value());
}

TEST(InitLogging, JsonFormatWritesOneParsableObjectPerLine) {
  const std::string tricky =
      "quote \" backslash \\ newline\nsecond line\ttab \x01 bell\x07 braces {} caf\xc3\xa9";
  const std::string out = CaptureStderr([&] {
    ASSERT_TRUE(InitLogging("gcomp_test[3]", "info", "json").ok());
    log::Info("first {}", 1);
    log::Warn("{}", tricky);
    log::Debug("below the level, not written");
    log::Error("bad byte \xff end");
  });
  ASSERT_TRUE(InitLogging("logging_test_after", "info").ok());  // back to text on stderr

  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  ASSERT_EQ(lines.size(), 4u) << out;  // three lines and the empty tail
  EXPECT_EQ(lines[3], "");
  std::vector<std::map<std::string, std::string>> parsed;
  for (int k = 0; k < 3; ++k) {
    auto fields = ParseFlatJsonObject(lines[k]);
    ASSERT_TRUE(fields.has_value()) << "not one JSON object: " << lines[k];
    EXPECT_EQ(fields->size(), 4u) << lines[k];
    EXPECT_EQ((*fields)["process"], "gcomp_test[3]");
    const std::string& ts = (*fields)["ts"];
    // 2026-12-03T08:10:00.123Z
    ASSERT_EQ(ts.size(), 24u) << ts;
    EXPECT_EQ(ts[4], '-');
    EXPECT_EQ(ts[10], 'T');
    EXPECT_EQ(ts[19], '.');
    EXPECT_EQ(ts[23], 'Z');
    parsed.push_back(*fields);
  }
  EXPECT_EQ(parsed[0]["level"], "info");
  EXPECT_EQ(parsed[0]["msg"], "first 1");
  EXPECT_EQ(parsed[1]["level"], "warn");
  EXPECT_EQ(parsed[1]["msg"], tricky);  // every character survives the round trip
  EXPECT_EQ(parsed[2]["level"], "error");
  EXPECT_EQ(parsed[2]["msg"], "bad byte \xef\xbf\xbd end");  // U+FFFD for the invalid byte
}

TEST(InitLogging, TextFormatIsOneLinePerMessageWithProgramAndLevel) {
  const std::string out = CaptureStderr([&] {
    ASSERT_TRUE(InitLogging("gcomp_text_test", "info", "text").ok());
    log::Info("hello {}", "world");
  });
  ASSERT_TRUE(InitLogging("logging_test_after2", "info").ok());
  EXPECT_NE(out.find(" gcomp_text_test] hello world\n"), std::string::npos) << out;
  EXPECT_NE(out.find("I"), std::string::npos) << out;
}

// What a peer sends (a tensor key, a worker name) lands in messages: control characters
// (C1 and direction overrides too) are escaped, so it can neither forge a line of its own
// nor write terminal escapes.
TEST(InitLogging, TextFormatEscapesControlCharacters) {
  const std::string key =
      std::string("k\n2026-12-05T00:00:00.000 E gcomp_server[0]] forged\r\x1b[31m") +
      std::string(1, '\0') +
      "\tend \xc3\xa9 \xc2\x9b"
      "2J \xe2\x80\xae";
  const std::string out = CaptureStderr([&] {
    ASSERT_TRUE(InitLogging("gcomp_escape_test", "info", "text").ok());
    log::Warn("declared '{}'", key);
  });
  ASSERT_TRUE(InitLogging("logging_test_after3", "info").ok());
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  EXPECT_NE(out.find("declared 'k\\n2026-12-05T00:00:00.000 E gcomp_server[0]] "
                     "forged\\x0d\\x1b[31m\\x00\\tend \xc3\xa9 \\u009b2J \\u202e'\n"),
            std::string::npos)
      << out;
}

// Events a peer can repeat at will: the first lines_per_second of each second are logged,
// the rest counted, and the count is logged once with the next second's first line.
TEST(Clip, KeepsShortTextAndCutsLongTextSayingItsLength) {
  EXPECT_EQ(log::Clip("shard 2 unreachable"), "shard 2 unreachable");
  const std::string long_reason(1 << 20, 'x');
  const std::string clipped = log::Clip(long_reason);
  EXPECT_EQ(clipped, std::string(200, 'x') + "... (1048576 bytes)");
  EXPECT_EQ(log::Clip("abcdef", 3), "abc... (6 bytes)");
}

TEST(LineBudget, AdmitsAFewLinesASecondAndCountsTheRest) {
  log::LineBudget budget(3, "test events");
  const std::string out = CaptureStderr([&] {
    ASSERT_TRUE(InitLogging("gcomp_budget_test", "info", "text").ok());
    int admitted = 0;
    for (int i = 0; i < 50; ++i) admitted += budget.Admit();
    EXPECT_EQ(admitted, 3);
    absl::SleepFor(absl::Milliseconds(1100));
    EXPECT_TRUE(budget.Admit());
    EXPECT_TRUE(budget.Admit());
  });
  ASSERT_TRUE(InitLogging("logging_test_after4", "info").ok());
  EXPECT_NE(out.find("47 more test events not logged"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
}

}  // namespace
}  // namespace gcomp

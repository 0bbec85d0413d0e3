#include "base/json.h"

#include <string>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(JsonQuote, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonQuote(""), "\"\"");
  EXPECT_EQ(JsonQuote("plain text"), "\"plain text\"");
  EXPECT_EQ(JsonQuote("say \"hi\""), "\"say \\\"hi\\\"\"");
  EXPECT_EQ(JsonQuote("C:\\dir\\"), "\"C:\\\\dir\\\\\"");
  EXPECT_EQ(JsonQuote("a\nb\tc\rd\be\ff"), "\"a\\nb\\tc\\rd\\be\\ff\"");
  EXPECT_EQ(JsonQuote(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  EXPECT_EQ(JsonQuote("\x1b[31m\x7f"), "\"\\u001b[31m\\u007f\"");
}

TEST(JsonQuote, KeepsValidUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(JsonQuote("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
            "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  EXPECT_EQ(JsonQuote("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(JsonQuote("a\x80" "b"), "\"a\\ufffdb\"");            // stray continuation
  EXPECT_EQ(JsonQuote("\xc3"), "\"\\ufffd\"");                    // truncated at the end
  EXPECT_EQ(JsonQuote("\xc0\xaf"), "\"\\ufffd\\ufffd\"");         // overlong '/'
  EXPECT_EQ(JsonQuote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // surrogate
  EXPECT_EQ(JsonQuote("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\"");  // > U+10FFFF
}

// Code points that act on a terminal or on the text's direction without showing.
TEST(JsonQuote, EscapesHiddenControls) {
  EXPECT_EQ(JsonQuote("\xc2\x9b"
                      "2J"),
            "\"\\u009b2J\"");                       // C1 CSI
  EXPECT_EQ(JsonQuote("\xc2\x85"), "\"\\u0085\"");  // C1 next line
  EXPECT_EQ(JsonQuote("txt\xe2\x80\xae"
                      "gpj"),
            "\"txt\\u202egpj\"");  // right-to-left override
  EXPECT_EQ(JsonQuote("\xe2\x81\xa6\xd8\x9c\xe2\x80\x8f"), "\"\\u2066\\u061c\\u200f\"");
  EXPECT_EQ(JsonQuote("\xc2\xa0\xe2\x80\xaf"), "\"\xc2\xa0\xe2\x80\xaf\"");  // spaces: shown
}

TEST(EscapeForText, EscapesWhatCouldForgeALineOrActOnATerminal) {
  EXPECT_EQ(EscapeForText("plain caf\xc3\xa9 \xe2\x82\xac"), "plain caf\xc3\xa9 \xe2\x82\xac");
  EXPECT_EQ(EscapeForText("a\nb\tc\rd"), "a\\nb\\tc\\x0dd");
  EXPECT_EQ(EscapeForText("\x1b[2J\x7f"), "\\x1b[2J\\x7f");
  EXPECT_EQ(EscapeForText(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(EscapeForText("\xc2\x9b"
                          "2J \xe2\x80\xae \xe2\x81\xa9"),
            "\\u009b2J \\u202e \\u2069");
  EXPECT_EQ(EscapeForText("\xff\xc3"), "\\xff\\xc3");  // invalid UTF-8, byte by byte
  EXPECT_EQ(EscapeForText("quote \" and \\ stay"), "quote \" and \\ stay");
}

TEST(AppendJsonString, Appends) {
  std::string out = "{\"k\":";
  AppendJsonString("v", &out);
  EXPECT_EQ(out, "{\"k\":\"v\"");
}

}  // namespace
}  // namespace gcomp

#include "base/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(Utf8SequenceLength, ReadsEachLengthAndItsCodePoint) {
  struct Case {
    std::string bytes;
    size_t length;
    uint32_t code_point;
  };
  const Case cases[] = {
      {"a", 1, 'a'},
      {std::string(1, '\0'), 1, 0},
      {"\x7f", 1, 0x7F},
      {"\xc2\x80", 2, 0x80},
      {"\xc3\xa9", 2, 0xE9},
      {"\xdf\xbf", 2, 0x7FF},
      {"\xe0\xa0\x80", 3, 0x800},
      {"\xe2\x80\x8e", 3, 0x200E},
      {"\xed\x9f\xbf", 3, 0xD7FF},
      {"\xee\x80\x80", 3, 0xE000},
      {"\xef\xbf\xbf", 3, 0xFFFF},
      {"\xf0\x90\x80\x80", 4, 0x10000},
      {"\xf4\x8f\xbf\xbf", 4, 0x10FFFF},
  };
  for (const Case& c : cases) {
    uint32_t cp = 0xDEAD;
    EXPECT_EQ(Utf8SequenceLength(c.bytes, 0, &cp), c.length) << c.code_point;
    EXPECT_EQ(cp, c.code_point);
  }
}

TEST(Utf8SequenceLength, RefusesWhatRfc3629Forbids) {
  const std::string bad[] = {
      "\x80",              // stray continuation byte
      "\xbf",              // another
      "\xc0\x80",          // overlong U+0000
      "\xc1\xbf",          // overlong U+007F
      "\xe0\x9f\xbf",      // overlong U+07FF
      "\xf0\x8f\xbf\xbf",  // overlong U+FFFF
      "\xed\xa0\x80",      // surrogate U+D800
      "\xed\xbf\xbf",      // surrogate U+DFFF
      "\xf4\x90\x80\x80",  // U+110000
      "\xf8\x88\x80\x80",  // five-byte lead
      "\xff",              // never a UTF-8 byte
      "\xc3",              // cut short
      "\xe2\x82",          // cut short
      "\xf0\x9f\x98",      // cut short
      "\xc3\x28",          // a continuation that is not one
  };
  for (const std::string& b : bad) {
    uint32_t cp = 0xDEAD;
    EXPECT_EQ(Utf8SequenceLength(b, 0, &cp), 0u) << b.size();
    EXPECT_EQ(cp, 0xDEADu);  // untouched
  }
}

TEST(Utf8SequenceLength, StartsWhereItIsTold) {
  uint32_t cp = 0;
  EXPECT_EQ(Utf8SequenceLength("ab\xc3\xa9", 2, &cp), 2u);
  EXPECT_EQ(cp, 0xE9u);
  EXPECT_EQ(Utf8SequenceLength("ab\xc3\xa9", 3, &cp), 0u);
}

TEST(IsValidUtf8, WholeStrings) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("shard-0.example:7000"));
  EXPECT_TRUE(IsValidUtf8("gr\xc3\xbc\xc3\x9f \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_TRUE(IsValidUtf8(std::string("a\0b", 3)));
  EXPECT_FALSE(IsValidUtf8("ok\xff"));
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80 surrogate"));
  EXPECT_FALSE(IsValidUtf8("cut \xe2\x82"));
}

TEST(Utf8Prefix, KeepsShortTextWhole) {
  EXPECT_EQ(Utf8Prefix("", 0), "");
  EXPECT_EQ(Utf8Prefix("abc", 3), "abc");
  EXPECT_EQ(Utf8Prefix("abc", 100), "abc");
}

TEST(Utf8Prefix, CutsBeforeACharacterItWouldSplit) {
  const std::string s = "a\xe2\x82\xac" "b";  // a, EURO SIGN, b
  EXPECT_EQ(Utf8Prefix(s, 0), "");
  EXPECT_EQ(Utf8Prefix(s, 1), "a");
  EXPECT_EQ(Utf8Prefix(s, 2), "a");
  EXPECT_EQ(Utf8Prefix(s, 3), "a");
  EXPECT_EQ(Utf8Prefix(s, 4), "a\xe2\x82\xac");
  // Every cut of a mixed string is valid and as long as it can be.
  const std::string mixed = "x\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80y";
  for (size_t max = 0; max <= mixed.size(); ++max) {
    const absl::string_view p = Utf8Prefix(mixed, max);
    EXPECT_TRUE(IsValidUtf8(p)) << max;
    EXPECT_LE(p.size(), max);
    EXPECT_GT(p.size() + 4, max) << max;
  }
}

TEST(AppendUtf8, RoundTripsEveryScalarValueAtItsLengthEdges) {
  const uint32_t edges[] = {0,      0x41,   0x7F,   0x80,    0x7FF,   0x800,    0xD7FF,
                            0xE000, 0xFFFD, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF};
  const size_t lengths[] = {1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 4, 4, 4};
  for (size_t k = 0; k < sizeof(edges) / sizeof(edges[0]); ++k) {
    std::string s = "x";
    ASSERT_TRUE(AppendUtf8(edges[k], &s)) << edges[k];
    ASSERT_EQ(s.size(), 1 + lengths[k]) << edges[k];
    uint32_t cp = 0;
    EXPECT_EQ(Utf8SequenceLength(s, 1, &cp), lengths[k]) << edges[k];
    EXPECT_EQ(cp, edges[k]);
  }
  // Every scalar value, checked against the decoder.
  for (uint32_t v = 0; v <= 0x10FFFF; v += (v < 0x10000 ? 1 : 97)) {
    if (v >= 0xD800 && v <= 0xDFFF) continue;
    std::string s;
    ASSERT_TRUE(AppendUtf8(v, &s)) << v;
    uint32_t cp = 0;
    ASSERT_EQ(Utf8SequenceLength(s, 0, &cp), s.size()) << v;
    ASSERT_EQ(cp, v);
  }
}

TEST(AppendUtf8, RefusesSurrogatesAndValuesPastTheLast) {
  for (uint32_t v : {0xD800u, 0xDBFFu, 0xDC00u, 0xDFFFu, 0x110000u, 0xFFFFFFFFu}) {
    std::string s = "keep";
    EXPECT_FALSE(AppendUtf8(v, &s)) << v;
    EXPECT_EQ(s, "keep");
  }
}

}  // namespace
}  // namespace gcomp

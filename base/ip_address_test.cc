#include "base/ip_address.h"

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(CanonicalIpAddressTest, OneSpellingPerAddress) {
  EXPECT_EQ(CanonicalIpAddress("10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(CanonicalIpAddress("::1"), "::1");
  EXPECT_EQ(CanonicalIpAddress("[::1]"), "::1");
  EXPECT_EQ(CanonicalIpAddress("%5B::1%5D"), "::1");
  EXPECT_EQ(CanonicalIpAddress("%5b0:0:0:0:0:0:0:1%5d"), "::1");
  EXPECT_EQ(CanonicalIpAddress("::ffff:10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(CanonicalIpAddress("FE80::1"), "fe80::1");
}

TEST(CanonicalIpAddressTest, AnythingElseIsNoAddress) {
  for (const char* text : {"", "[]", "%5B%5D", "localhost", "10.0.0", "10.0.0.256",
                           "10.0.0.7:80", "unix:/tmp/s", "::1]", "1::2::3", " 10.0.0.7"}) {
    EXPECT_EQ(CanonicalIpAddress(text), std::nullopt) << text;
  }
}

}  // namespace
}  // namespace gcomp

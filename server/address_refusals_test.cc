#include "server/address_refusals.h"

#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

TEST(AddressRefusalsTest, AddressIsThePeersHostWithoutPort) {
  EXPECT_EQ(AddressOfPeer("ipv4:10.0.0.7:51234"), "10.0.0.7");
  EXPECT_EQ(AddressOfPeer("ipv6:[::1]:51234"), "[::1]");
  EXPECT_EQ(AddressOfPeer("ipv6:%5B::1%5D:5"), "%5B::1%5D");
  EXPECT_EQ(AddressOfPeer("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(AddressOfPeer("nothing"), "nothing");
}

TEST(AddressRefusalsTest, EachOffenceAfterARefusalDoublesItUpToTheLongest) {
  AddressRefusals r(absl::Seconds(1), absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(r.RefusedFor("a", t0), absl::ZeroDuration());
  r.Refuse("a", t0);
  EXPECT_EQ(r.RefusedFor("a", t0), absl::Seconds(1));
  EXPECT_EQ(r.RefusedFor("b", t0), absl::ZeroDuration());  // only the offender
  // While refused, more offences are the same one.
  r.Refuse("a", t0 + absl::Milliseconds(500));
  EXPECT_EQ(r.RefusedFor("a", t0 + absl::Milliseconds(500)), absl::Milliseconds(500));
  EXPECT_EQ(r.RefusedFor("a", t0 + absl::Seconds(1)), absl::ZeroDuration());
  absl::Time t = t0 + absl::Seconds(2);
  for (absl::Duration want :
       {absl::Seconds(2), absl::Seconds(4), absl::Seconds(5), absl::Seconds(5)}) {
    r.Refuse("a", t);
    EXPECT_EQ(r.RefusedFor("a", t), want);
    t += want + absl::Seconds(1);
  }
}

TEST(AddressRefusalsTest, AQuietAddressStartsOverAndIsForgotten) {
  AddressRefusals r(absl::Seconds(1), absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  r.Refuse("a", t0);
  r.Refuse("a", t0 + absl::Seconds(2));  // 2 s, to t0 + 4 s
  r.Forget(t0 + absl::Seconds(8));       // remembered to t0 + 9 s
  EXPECT_EQ(r.size(), 1u);
  r.Forget(t0 + absl::Seconds(9));
  EXPECT_EQ(r.size(), 0u);
  r.Refuse("a", t0 + absl::Seconds(10));
  EXPECT_EQ(r.RefusedFor("a", t0 + absl::Seconds(10)), absl::Seconds(1));
  // Without Forget, the same: more than `longest` quiet after the refusal ended.
  r.Refuse("a", t0 + absl::Seconds(17));
  EXPECT_EQ(r.RefusedFor("a", t0 + absl::Seconds(17)), absl::Seconds(1));
}

TEST(AddressRefusalsTest, NeverRefusedAddressesAreNotRefusedInAnySpelling) {
  AddressRefusals r(absl::Seconds(1), absl::Seconds(5), {"127.0.0.6", "::1"});
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  for (const char* a : {"127.0.0.6", "%5B::1%5D", "[::1]", "::ffff:127.0.0.6"}) {
    EXPECT_TRUE(r.NeverRefused(a)) << a;
    r.Refuse(a, t0);
    EXPECT_EQ(r.RefusedFor(a, t0), absl::ZeroDuration()) << a;
  }
  r.Refuse("127.0.0.7", t0);  // others still are
  EXPECT_EQ(r.RefusedFor("127.0.0.7", t0), absl::Seconds(1));
  AddressRefusals none(absl::Seconds(1), absl::Seconds(5), {"*"});
  none.Refuse("10.1.2.3", t0);
  none.Refuse("unix:/tmp/s", t0);
  EXPECT_EQ(none.RefusedFor("10.1.2.3", t0), absl::ZeroDuration());
  EXPECT_EQ(none.RefusedFor("unix:/tmp/s", t0), absl::ZeroDuration());
  EXPECT_EQ(none.size(), 0u);
}

}  // namespace
}  // namespace gcomp::server

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

}  // namespace
}  // namespace gcomp::server

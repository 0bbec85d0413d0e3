#include "coord/memory_store.h"

#include <vector>

#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

Txn PutTxn(const std::string& key, const std::string& value, LeaseId lease = kNoLease) {
  Txn t;
  t.puts.push_back({key, value, lease});
  return t;
}

TEST(MemoryStore, RevisionsAndCompareAndSwapFollowEtcd) {
  MemoryStore s;
  absl::StatusOr<TxnResult> r = s.Commit(PutTxn("/a", "1"));
  ASSERT_TRUE(r.ok() && r->committed);
  const KeyValue first = **s.Get("/a");
  EXPECT_EQ(first.create_revision, first.mod_revision);
  ASSERT_TRUE(s.Commit(PutTxn("/a", "2"))->committed);
  const KeyValue second = **s.Get("/a");
  EXPECT_EQ(second.create_revision, first.create_revision);
  EXPECT_GT(second.mod_revision, first.mod_revision);

  Txn cas = PutTxn("/a", "3");
  cas.conditions.push_back({"/a", Condition::Field::kModRevision, first.mod_revision});
  EXPECT_FALSE(s.Commit(cas)->committed);
  cas.conditions[0].revision = second.mod_revision;
  EXPECT_TRUE(s.Commit(cas)->committed);
  EXPECT_FALSE(s.Commit(cas)->committed);  // the same decision twice: once only
  EXPECT_EQ((**s.Get("/a")).value, "3");

  Txn create = PutTxn("/b", "x");
  create.conditions.push_back({"/b", Condition::Field::kCreateRevision, 0});
  EXPECT_TRUE(s.Commit(create)->committed);
  EXPECT_FALSE(s.Commit(create)->committed);
  ASSERT_EQ(s.GetPrefix("/")->size(), 2u);
}

TEST(MemoryStore, LeasesExpireOnTheStoresClockAndTakeTheirKeys) {
  MemoryStore s;
  const LeaseId lease = *s.GrantLease(absl::Seconds(2));
  ASSERT_TRUE(s.Commit(PutTxn("/m/0", "me", lease))->committed);
  s.Advance(absl::Seconds(1));
  EXPECT_EQ(*s.KeepAlive(lease), absl::Seconds(2));
  s.Advance(absl::Milliseconds(1900));
  EXPECT_TRUE(s.Get("/m/0")->has_value());
  s.Advance(absl::Milliseconds(200));
  EXPECT_FALSE(s.Get("/m/0")->has_value());
  EXPECT_TRUE(absl::IsNotFound(s.KeepAlive(lease).status()));
  EXPECT_TRUE(absl::IsNotFound(s.Commit(PutTxn("/m/0", "again", lease)).status()));

  const LeaseId other = *s.GrantLease(absl::Seconds(5));
  ASSERT_TRUE(s.Commit(PutTxn("/m/1", "x", other))->committed);
  s.ExpireLease(other);
  EXPECT_FALSE(s.Get("/m/1")->has_value());
}

TEST(MemoryStore, WatchReplaysFromTheRevisionThenFollows) {
  MemoryStore s;
  ASSERT_TRUE(s.Commit(PutTxn("/w/a", "1"))->committed);
  const int64_t after = s.revision();
  ASSERT_TRUE(s.Commit(PutTxn("/w/b", "2"))->committed);
  std::vector<WatchEvent> seen;
  auto w = s.WatchPrefix("/w/", after, [&](const WatchEvent& e) { seen.push_back(e); },
                         [](const absl::Status&) {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(s.Commit(PutTxn("/x", "ignored"))->committed);
  Txn del;
  del.deletes.push_back("/w/a");
  ASSERT_TRUE(s.Commit(del)->committed);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].kv.key, "/w/b");
  EXPECT_EQ(seen[1].type, WatchEvent::Type::kDelete);
  w->reset();
  ASSERT_TRUE(s.Commit(PutTxn("/w/c", "3"))->committed);
  EXPECT_EQ(seen.size(), 2u);
}

TEST(MemoryStore, UnreachableStoreRefusesEveryCall) {
  MemoryStore s;
  s.SetUnreachable(true);
  EXPECT_TRUE(absl::IsUnavailable(s.Get("/a").status()));
  EXPECT_TRUE(absl::IsUnavailable(s.Commit(PutTxn("/a", "1")).status()));
  EXPECT_TRUE(absl::IsUnavailable(s.GrantLease(absl::Seconds(1)).status()));
  s.SetUnreachable(false);
  EXPECT_TRUE(s.Commit(PutTxn("/a", "1")).ok());
}

}  // namespace
}  // namespace gcomp::coord

// EtcdStore against real etcd members started by the test (coord/etcd_process.h).
#include "coord/etcd_store.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coord/etcd_process.h"
#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

std::unique_ptr<EtcdCluster> StartCluster(int members) {
  EtcdClusterOptions o;
  o.members = members;
  absl::StatusOr<std::unique_ptr<EtcdCluster>> c = EtcdCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::unique_ptr<EtcdStore> Connect(const EtcdCluster& c) {
  EtcdStoreOptions o;
  o.endpoints = c.endpoints();
  o.request_timeout = absl::Seconds(1);
  absl::StatusOr<std::unique_ptr<EtcdStore>> s = EtcdStore::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

absl::StatusOr<TxnResult> Set(Store* s, const std::string& key, const std::string& value) {
  Txn t;
  t.puts.push_back({key, value, kNoLease});
  return s->Commit(t);
}

TEST(EtcdStore, EndpointsAreChecked) {
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdStore::Create({}).status()));
  EtcdStoreOptions o;
  o.endpoints = {"127.0.0.1:2379", "no-port"};
  absl::Status s = EtcdStore::Create(o).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("'no-port'"), std::string::npos) << s;
  o.endpoints = {"127.0.0.1:70000"};
  EXPECT_TRUE(absl::IsInvalidArgument(EtcdStore::Create(o).status()));
}

TEST(EtcdStore, NobodyListeningIsUnavailableNamingTheEndpoint) {
  EtcdStoreOptions o;
  o.endpoints = {"127.0.0.1:1"};
  o.request_timeout = absl::Milliseconds(500);
  std::unique_ptr<EtcdStore> s = *EtcdStore::Create(o);
  absl::Status st = s->Get("/k").status();
  EXPECT_TRUE(absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("127.0.0.1:1"), std::string::npos) << st;
}

TEST(EtcdStore, GetPutDeleteAndPrefixInKeyOrder) {
  auto c = StartCluster(1);
  ASSERT_NE(c, nullptr);
  auto s = Connect(*c);
  EXPECT_FALSE(s->Get("/a/x")->has_value());
  ASSERT_TRUE(Set(s.get(), "/a/2", "two").ok());
  ASSERT_TRUE(Set(s.get(), "/a/1", "one").ok());
  ASSERT_TRUE(Set(s.get(), "/b", "other").ok());
  absl::StatusOr<std::optional<KeyValue>> got = s->Get("/a/1");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->value, "one");
  EXPECT_GT((*got)->mod_revision, 0);
  absl::StatusOr<std::vector<KeyValue>> all = s->GetPrefix("/a/");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, "/a/1");
  EXPECT_EQ((*all)[1].key, "/a/2");
  Txn del;
  del.deletes.push_back("/a/1");
  ASSERT_TRUE(s->Commit(del)->committed);
  EXPECT_FALSE(s->Get("/a/1")->has_value());
}

// The property the cluster's map rests on: of writers that read the same revision, exactly
// one commits, so concurrent read-modify-write loops lose no update.
TEST(EtcdStore, CompareAndSwapLetsExactlyOneWriterWin) {
  auto c = StartCluster(1);
  ASSERT_NE(c, nullptr);
  auto s = Connect(*c);
  ASSERT_TRUE(Set(s.get(), "/counter", "0").ok());
  const int64_t rev = (*s->Get("/counter"))->mod_revision;
  int committed = 0;
  for (int w = 0; w < 4; ++w) {
    Txn t;
    t.conditions.push_back({"/counter", Condition::Field::kModRevision, rev});
    t.puts.push_back({"/counter", absl::StrCat("writer", w), kNoLease});
    absl::StatusOr<TxnResult> r = s->Commit(t);
    ASSERT_TRUE(r.ok()) << r.status();
    committed += r->committed;
  }
  EXPECT_EQ(committed, 1);

  constexpr int kThreads = 4, kEach = 25;
  std::vector<std::thread> threads;
  std::atomic<int> retries{0};
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int n = 0; n < kEach; ++n) {
        while (true) {
          std::optional<KeyValue> kv = *s->Get("/n");
          const int v = kv ? std::stoi(kv->value) : 0;
          Txn t;
          t.conditions.push_back({"/n", Condition::Field::kModRevision, kv ? kv->mod_revision : 0});
          t.puts.push_back({"/n", std::to_string(v + 1), kNoLease});
          absl::StatusOr<TxnResult> r = s->Commit(t);
          ASSERT_TRUE(r.ok()) << r.status();
          if (r->committed) break;
          ++retries;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*s->Get("/n"))->value, std::to_string(kThreads * kEach));
  // Absent-key condition: create once only.
  Txn create;
  create.conditions.push_back({"/once", Condition::Field::kCreateRevision, 0});
  create.puts.push_back({"/once", "first", kNoLease});
  EXPECT_TRUE(s->Commit(create)->committed);
  create.puts[0].value = "second";
  EXPECT_FALSE(s->Commit(create)->committed);
  EXPECT_EQ((*s->Get("/once"))->value, "first");
}

TEST(EtcdStore, KeysOfAnExpiredLeaseVanish) {
  auto c = StartCluster(1);
  ASSERT_NE(c, nullptr);
  auto s = Connect(*c);
  absl::StatusOr<LeaseId> lease = s->GrantLease(absl::Seconds(1));
  ASSERT_TRUE(lease.ok()) << lease.status();
  Txn t;
  t.puts.push_back({"/alive", "yes", *lease});
  ASSERT_TRUE(s->Commit(t)->committed);
  EXPECT_EQ((*s->Get("/alive"))->lease, *lease);
  absl::StatusOr<absl::Duration> ttl = s->KeepAlive(*lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  // etcd grants at least 1.5 election timeouts (here 2 s): never less than asked.
  EXPECT_GE(*ttl, absl::Seconds(1));
  EXPECT_LE(*ttl, absl::Seconds(2));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (s->Get("/alive")->has_value() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(s->Get("/alive")->has_value());
  EXPECT_TRUE(absl::IsNotFound(s->KeepAlive(*lease).status()));
  EXPECT_TRUE(s->Revoke(*lease).ok());  // already gone: not an error

  absl::StatusOr<LeaseId> other = s->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(other.ok());
  t.puts[0].lease = *other;
  ASSERT_TRUE(s->Commit(t)->committed);
  ASSERT_TRUE(s->Revoke(*other).ok());
  EXPECT_FALSE(s->Get("/alive")->has_value());
}

struct Recorder {
  absl::Mutex mu;
  std::vector<WatchEvent> events ABSL_GUARDED_BY(mu);
  std::vector<absl::Status> errors ABSL_GUARDED_BY(mu);
  // Watches `prefix` of `store` after `after`, recording into this.
  absl::StatusOr<std::unique_ptr<Watch>> Follow(Store* store, const std::string& prefix,
                                               int64_t after) {
    return store->WatchPrefix(
        prefix, after,
        [this](const WatchEvent& e) {
          absl::MutexLock l(&mu);
          events.push_back(e);
        },
        [this](const absl::Status& st) {
          absl::MutexLock l(&mu);
          errors.push_back(st);
        });
  }
  bool WaitFor(size_t n, absl::Duration timeout) {
    absl::MutexLock l(&mu);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return events.size() >= n; };
    return mu.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
};

TEST(EtcdStore, WatchDeliversChangesAfterTheRevisionInOrder) {
  auto c = StartCluster(1);
  ASSERT_NE(c, nullptr);
  auto s = Connect(*c);
  const int64_t before = Set(s.get(), "/w/0", "old")->revision;
  Recorder rec;
  absl::StatusOr<std::unique_ptr<Watch>> w = rec.Follow(s.get(), "/w/", before);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(Set(s.get(), "/w/1", "a").ok());
  ASSERT_TRUE(Set(s.get(), "/elsewhere", "x").ok());
  ASSERT_TRUE(Set(s.get(), "/w/1", "b").ok());
  Txn del;
  del.deletes.push_back("/w/0");
  ASSERT_TRUE(s->Commit(del).ok());
  ASSERT_TRUE(rec.WaitFor(3, absl::Seconds(10)));
  absl::MutexLock l(&rec.mu);
  ASSERT_EQ(rec.events.size(), 3u);
  EXPECT_EQ(rec.events[0].kv.value, "a");
  EXPECT_EQ(rec.events[1].kv.value, "b");
  EXPECT_EQ(rec.events[2].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(rec.events[2].kv.key, "/w/0");
  EXPECT_LT(rec.events[0].kv.mod_revision, rec.events[1].kv.mod_revision);
  EXPECT_TRUE(rec.errors.empty());
}

// Three members, one killed at a time (the one the client talks to first included): reads,
// compare-and-swap and a running watch carry on through the other two.
TEST(EtcdStore, ThreeMembersSurviveTheLossOfAnyOne) {
  auto c = StartCluster(3);
  ASSERT_NE(c, nullptr);
  auto s = Connect(*c);
  Recorder rec;
  auto w = rec.Follow(s.get(), "/m/", 0);
  ASSERT_TRUE(w.ok());
  int writes = 0;
  for (int victim = 0; victim < 3; ++victim) {
    c->Kill(victim);
    for (int i = 0; i < 3; ++i) {
      // The first write after a leader's loss may wait out an election: retry a few times.
      absl::StatusOr<TxnResult> r;
      for (int attempt = 0; attempt < 20; ++attempt) {
        r = Set(s.get(), absl::StrCat("/m/", victim, "/", i), "v");
        if (r.ok()) break;
        absl::SleepFor(absl::Milliseconds(250));
      }
      ASSERT_TRUE(r.ok()) << "member " << victim << " down: " << r.status();
      ++writes;
    }
    EXPECT_TRUE(s->Get(absl::StrCat("/m/", victim, "/0"))->has_value());
    ASSERT_TRUE(c->Restart(victim).ok());
    // Let the restarted member catch up before the next one goes.
    absl::SleepFor(absl::Seconds(1));
  }
  EXPECT_TRUE(rec.WaitFor(writes, absl::Seconds(20)));
  absl::MutexLock l(&rec.mu);
  EXPECT_EQ(static_cast<int>(rec.events.size()), writes);
  EXPECT_TRUE(rec.errors.empty()) << rec.errors[0];
}

TEST(EtcdStore, PrefixRangeEnd) {
  EXPECT_EQ(PrefixRangeEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

}  // namespace
}  // namespace gcomp::coord

#include "admin/coordination.h"

#include "coord/job_run.h"
#include "coord/map_record.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"

namespace gcomp::admin {
namespace {

TEST(Coordination, ReportsTheRecordTheLeasesAndTheCoordinator) {
  coord::MemoryStore store;
  absl::StatusOr<CoordinationStatus> empty = CollectCoordination(&store, "job");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE(empty->map.has_value());
  EXPECT_FALSE(empty->healthy());
  EXPECT_NE(FormatCoordinationText(*empty).find("no map record yet"), std::string::npos);

  proto::ShardMapRecord r;
  r.set_epoch(3);
  r.add_shards("h:1");
  r.add_shards("h:2");
  r.set_replicas(2);
  r.add_down_shards(1);
  r.set_written_by("shard 0");
  ASSERT_TRUE(coord::CreateMapIfAbsent(&store, "job", r).ok());
  const coord::LeaseId lease = *store.GrantLease(absl::Seconds(5));
  proto::MemberRecord m;
  m.set_address("h:1");
  ASSERT_TRUE(coord::RegisterMember(&store, "job", 0, m, lease).ok());
  coord::Txn lead;
  lead.puts.push_back({coord::JobKeys("job").coordinator, "shard 0", lease});
  ASSERT_TRUE(store.Commit(lead)->committed);

  absl::StatusOr<CoordinationStatus> s = CollectCoordination(&store, "job");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->healthy());  // shard 1 is down in the map, so it needs no lease
  const std::string text = FormatCoordinationText(*s);
  EXPECT_NE(text.find("map epoch 3"), std::string::npos) << text;
  EXPECT_NE(text.find("down [1]"), std::string::npos) << text;
  EXPECT_NE(text.find("coordinator: shard 0"), std::string::npos) << text;
  EXPECT_NE(text.find("none: shard 1"), std::string::npos) << text;
  const std::string json = FormatCoordinationJson(*s);
  EXPECT_NE(json.find("\"epoch\":3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"healthy\":true"), std::string::npos) << json;

  EXPECT_NE(json.find("\"run\":null"), std::string::npos) << json;  // no run entered yet
  EXPECT_NE(text.find("not serving yet"), std::string::npos) << text;

  // Shard 0 starts the job's first run: the run and its generation on the member show.
  ASSERT_TRUE(coord::EnterRun(&store, "job", 0, &m, lease,
                              []() -> absl::StatusOr<std::string> { return "final-of-2"; })
                  .ok());
  s = CollectCoordination(&store, "job");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(FormatCoordinationText(*s).find("run: 1, started by shard 0, restores final-of-2, "
                                            "entered [0]"),
            std::string::npos)
      << FormatCoordinationText(*s);
  EXPECT_NE(FormatCoordinationText(*s).find("lease " + std::to_string(lease) + ", run 1)"),
            std::string::npos);
  EXPECT_NE(FormatCoordinationJson(*s).find(
                "\"run\":{\"generation\":1,\"started_by\":\"shard 0\",\"restore_set\":"
                "\"final-of-2\",\"entered\":[0]}"),
            std::string::npos)
      << FormatCoordinationJson(*s);

  store.ExpireLease(lease);  // shard 0's lease ends: the map lists it live, nothing holds it
  s = CollectCoordination(&store, "job");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->healthy());
  EXPECT_EQ(s->coordinator, "");
}

TEST(Coordination, UnreachableStoreIsAnError) {
  coord::MemoryStore store;
  store.SetUnreachable(true);
  EXPECT_TRUE(absl::IsUnavailable(CollectCoordination(&store, "job").status()));
  proto::ClusterConfig c;
  EXPECT_TRUE(absl::IsFailedPrecondition(CollectCoordination(c).status()));
}

}  // namespace
}  // namespace gcomp::admin

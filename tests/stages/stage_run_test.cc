// The skeleton every stage shares: run records, the resume check of the
// judging options, in-flight marks, shards and finishing.
#include "stages/stage_run.h"

#include <atomic>

#include <gtest/gtest.h>

#include "registry/registry.h"
#include "tests/support/temp_dir.h"

namespace coverage::stages {
namespace {

using testing::TempDir;

std::unique_ptr<registry::Registry> Open(const TempDir& dir) {
  auto r = registry::Registry::Open(dir.File("r.db"));
  EXPECT_TRUE(r.has_value()) << r.error().ToString();
  return std::move(*r);
}

TEST(StageRun, ANewRunGetsAnIdNamingBackendAndStageAndFinishes) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o;
  o.backend = "privateuse1:/x/y.so";
  o.config_json = R"({"replay": {"seed": 0}})";
  auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(run.has_value()) << run.error().ToString();
  EXPECT_FALSE(run->resumed());
  EXPECT_NE(run->id().find("-privateuse1__x_y_so-unit-"), std::string::npos) << run->id();
  auto stored = reg->GetRun(run->id());
  ASSERT_TRUE(stored.has_value() && stored->has_value());
  EXPECT_EQ((*stored)->stage, "unit");
  EXPECT_TRUE((*stored)->finished_at.empty());
  ASSERT_TRUE(run->Finish(/*interrupted=*/true).ok());
  EXPECT_TRUE((*reg->GetRun(run->id()))->finished_at.empty()) << "an interrupted invocation finishes nothing";
  ASSERT_TRUE(run->Finish(/*interrupted=*/false).ok());
  EXPECT_FALSE((*reg->GetRun(run->id()))->finished_at.empty());
}

TEST(StageRun, ResumingWithOtherJudgingOptionsIsRefusedOthersMayChange) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o;
  o.run_id = "r1";
  o.config_json = R"({"checks": {"top_k": 5}, "threads": 1})";
  ASSERT_TRUE(StageRun::Open(*reg, "model", "model", "checks", o).has_value());
  o.config_json = R"({"checks": {"top_k": 5}, "threads": 2})";
  auto same = StageRun::Open(*reg, "model", "model", "checks", o);
  ASSERT_TRUE(same.has_value()) << same.error().ToString();
  EXPECT_TRUE(same->resumed());
  o.config_json = R"({"checks": {"top_k": 1}})";
  auto other = StageRun::Open(*reg, "model", "model", "checks", o);
  ASSERT_FALSE(other.has_value());
  EXPECT_NE(other.error().message().find("run 'r1' was started with checks options {\"top_k\":5}"), std::string::npos)
      << other.error().message();
  EXPECT_NE(other.error().message().find("would mix results judged differently"), std::string::npos);
  // Another stage under the same id is refused by the registry.
  EXPECT_FALSE(StageRun::Open(*reg, "unit", "unit", "replay", o).has_value());
}

TEST(StageRun, InFlightMarksOfAnEarlierInvocationAreSeenOnResume) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o;
  o.run_id = "r2";
  {
    auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
    ASSERT_TRUE(run.has_value());
    ASSERT_TRUE(run->Begin("case:7").ok());
    EXPECT_FALSE(run->WasInFlight("case:7")) << "marks are those of earlier invocations";
  }
  auto again = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->WasInFlight("case:7"));
  EXPECT_FALSE(again->WasInFlight("case:8"));
}

TEST(StageRun, AShardOwnsItsKeysAndFinishesItsPartNotTheRun) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o;
  o.run_id = "r3";
  o.shard = Shard{1, 3};
  auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(run.has_value());
  int owned = 0;
  for (int i = 0; i < 300; ++i) owned += run->Owns("key" + std::to_string(i));
  EXPECT_GT(owned, 50);
  EXPECT_LT(owned, 150);
  ASSERT_TRUE(run->Finish(false).ok());
  EXPECT_TRUE((*reg->GetRun("r3"))->finished_at.empty()) << "the run finishes when merge has every shard";
  auto shards = reg->Query("SELECT shard_index, shard_count, finished_at IS NOT NULL FROM run_shards WHERE run_id = 'r3'");
  ASSERT_TRUE(shards.has_value());
  ASSERT_EQ(shards->rows.size(), 1u);
  EXPECT_EQ(shards->rows[0], (std::vector<std::string>{"1", "3", "1"}));
}

TEST(StageRun, StopIsRequestedThroughTheFlag) {
  TempDir dir;
  auto reg = Open(dir);
  std::atomic<bool> stop{false};
  StageRunOptions o;
  o.stop = &stop;
  auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(run.has_value());
  EXPECT_FALSE(run->StopRequested());
  stop = true;
  EXPECT_TRUE(run->StopRequested());
}

}  // namespace
}  // namespace coverage::stages

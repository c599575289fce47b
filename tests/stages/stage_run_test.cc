// The skeleton every stage shares: run records, the resume check of the
// judging options, in-flight marks, shards and finishing.
#include "stages/stage_run.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

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

// A child process that lives until it is killed.
pid_t StartSleeper() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// A writer of run `id` on host "h".
StageRunOptions Writer(const std::string& id) {
  StageRunOptions o;
  o.run_id = id;
  o.host = "h";
  return o;
}

void Kill(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

TEST(StageRun, OneRunIdHasOneLiveWriter) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o = Writer("r4");
  {
    auto first = StageRun::Open(*reg, "unit", "unit", "replay", o);
    ASSERT_TRUE(first.has_value()) << first.error().ToString();
    auto second = StageRun::Open(*reg, "unit", "unit", "replay", o);
    ASSERT_FALSE(second.has_value()) << "the first writer is alive (this process)";
    const std::string m = second.error().message();
    EXPECT_NE(m.find("run 'r4' is being written by process " + std::to_string(getpid()) + " on host 'h'"),
              std::string::npos) << m;
    EXPECT_NE(m.find("--shard i/N"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was written"), std::string::npos) << m;
  }
  // The first gave its lease back when it ended.
  auto again = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(again.has_value()) << again.error().ToString();
  EXPECT_TRUE(again->resumed());
  EXPECT_TRUE(again->taken_over().empty());
}

TEST(StageRun, ALeaseOfAKilledProcessIsTakenOverAndSaidSo) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o = Writer("r5");
  std::vector<std::string> notices;
  o.notice = [&](const std::string& m) { notices.push_back(m); };
  ASSERT_TRUE(StageRun::Open(*reg, "unit", "unit", "replay", o).has_value());  // creates the run, then ends

  // Another process of this host holds the lease, as a running writer would.
  const pid_t child = StartSleeper();
  ASSERT_GT(child, 0);
  const auto start = ProcessStartTicks(child);
  ASSERT_TRUE(start.has_value());
  registry::RunLease theirs{.run_id = "r5", .host = "h", .pid = child, .process_start = *start};
  auto held = reg->AcquireRunLease(theirs, [](const registry::RunLease&) { return true; }, nullptr);
  ASSERT_TRUE(held.has_value() && !held->has_value());
  auto refused = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_FALSE(refused.has_value()) << "a live process holds the run";
  EXPECT_NE(refused.error().message().find("process " + std::to_string(child) + " on host 'h'"), std::string::npos)
      << refused.error().message();

  Kill(child);  // as SIGKILL would leave it: the lease stays behind
  EXPECT_FALSE(ProcessStartTicks(child).has_value());
  auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(run.has_value()) << run.error().ToString();
  ASSERT_EQ(run->taken_over().size(), 1u);
  EXPECT_EQ(run->taken_over()[0].pid, child);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_NE(notices[0].find("run 'r5': taking over from process " + std::to_string(child) + " on host 'h'"),
            std::string::npos) << notices[0];
  EXPECT_NE(notices[0].find("no longer running"), std::string::npos);
}

TEST(StageRun, AReusedPidOrAStaleLeaseOfAnotherHostIsNotTheHolder) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions o = Writer("r6");
  ASSERT_TRUE(StageRun::Open(*reg, "unit", "unit", "replay", o).has_value());
  const auto mine = ProcessStartTicks(getpid());
  ASSERT_TRUE(mine.has_value());
  // This pid, but a process that started at another time: not this one.
  registry::RunLease reused{.run_id = "r6", .host = "h", .pid = getpid(), .process_start = *mine + 1};
  EXPECT_FALSE(RunLeaseHolderIsLive(reused, "h"));
  reused.process_start = *mine;
  EXPECT_TRUE(RunLeaseHolderIsLive(reused, "h"));
  // On another host only the renewal time tells.
  registry::RunLease far{.run_id = "r6", .host = "elsewhere", .pid = 1, .age_seconds = 30};
  EXPECT_TRUE(RunLeaseHolderIsLive(far, "h"));
  far.age_seconds = kRunLeaseLifeSeconds + 1;
  EXPECT_FALSE(RunLeaseHolderIsLive(far, "h"));

  auto held = reg->AcquireRunLease(far, [](const registry::RunLease&) { return true; }, nullptr);
  ASSERT_TRUE(held.has_value() && !held->has_value());
  auto refused = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_FALSE(refused.has_value()) << "just renewed on another host";
  EXPECT_NE(refused.error().message().find("on host 'elsewhere'"), std::string::npos);
  ASSERT_TRUE(reg->Query("UPDATE run_leases SET renewed_at = '2026-01-01T00:00:00Z'").has_value());
  auto run = StageRun::Open(*reg, "unit", "unit", "replay", o);
  ASSERT_TRUE(run.has_value()) << run.error().ToString();
  EXPECT_EQ(run->taken_over().size(), 1u);
}

TEST(StageRun, ShardsOfOneSplitAreSeparateWriters) {
  TempDir dir;
  auto reg = Open(dir);
  StageRunOptions a = Writer("r7"), b = Writer("r7"), whole = Writer("r7");
  a.shard = Shard{0, 2};
  b.shard = Shard{1, 2};
  auto first = StageRun::Open(*reg, "unit", "unit", "replay", a);
  ASSERT_TRUE(first.has_value()) << first.error().ToString();
  auto second = StageRun::Open(*reg, "unit", "unit", "replay", b);
  ASSERT_TRUE(second.has_value()) << second.error().ToString();
  auto all = StageRun::Open(*reg, "unit", "unit", "replay", whole);
  ASSERT_FALSE(all.has_value()) << "the whole run overlaps both shards";
  EXPECT_NE(all.error().message().find("shard 0/2 of run 'r7' is being written"), std::string::npos)
      << all.error().message();
  auto same = StageRun::Open(*reg, "unit", "unit", "replay", a);
  EXPECT_FALSE(same.has_value()) << "one shard has one writer";
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

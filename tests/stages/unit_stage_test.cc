#include <algorithm>
#include <atomic>
#include <set>

#include <gtest/gtest.h>

#include "core/cost.h"

#include "registry/registry.h"
#include "backends/backends.h"
#include "replay/replay.h"
#include "stages/unit_stage.h"
#include "tests/support/case_builder.h"
#include "tests/support/fake_backend.h"
#include "tests/support/temp_dir.h"

namespace coverage::stages {
namespace {

using testing::TempDir;

// Counts executions and stops the run after `stop_after` cases.
class CountingExecutor final : public replay::CaseExecutor {
 public:
  CaseResult Run(const OpCase& c) override {
    ++runs;
    seen.push_back(c.Key());
    if (stop && runs >= stop_after) stop->store(true);
    CaseResult r;
    r.outcome = Outcome::kPass;
    return r;
  }
  int runs = 0;
  int stop_after = 0;
  std::atomic<bool>* stop = nullptr;
  std::vector<std::string> seen;
};

class UnitStage : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = registry::Registry::Open(dir_.File("r.db"));
    ASSERT_TRUE(r.has_value()) << r.error().ToString();
    reg_ = std::move(*r);
    for (int n = 1; n <= 6; ++n) AddCase(testing::MmCase(n, 4, 4), 32.0 * n);
    for (int n = 1; n <= 4; ++n) AddCase(testing::MulCase({n, 8}), 8.0 * n);
  }
  void AddCase(const OpCase& c, double flops) {
    auto id = reg_->UpsertCase(c, {flops, 0});
    ASSERT_TRUE(id.has_value());
    ASSERT_TRUE(reg_->AddCaseSource(*id, {"m/x", "layers.0", "", "prefill", 0, 1}).ok());
  }
  int64_t ResultRows(const std::string& run) {
    auto q = reg_->Query("SELECT COUNT(*) FROM results WHERE run_id = ?1", {run});
    return std::stoll(q->rows[0][0]);
  }
  TempDir dir_;
  std::unique_ptr<registry::Registry> reg_;
};

TEST_F(UnitStage, ResumingWithTheSameRunIdSkipsFinishedCases) {
  std::atomic<bool> stop{false};
  CountingExecutor first;
  first.stop = &stop;
  first.stop_after = 4;
  UnitStageOptions options;
  options.run_id = "nightly-1";
  options.progress = false;
  options.stop = &stop;
  auto s1 = RunUnitStage(*reg_, first, options);
  ASSERT_TRUE(s1.has_value()) << s1.error().ToString();
  EXPECT_TRUE(s1->interrupted);
  EXPECT_EQ(first.runs, 4);
  EXPECT_EQ(ResultRows("nightly-1"), 4);

  stop.store(false);
  CountingExecutor second;
  auto s2 = RunUnitStage(*reg_, second, options);
  ASSERT_TRUE(s2.has_value());
  EXPECT_TRUE(s2->resumed);
  EXPECT_FALSE(s2->interrupted);
  EXPECT_EQ(s2->already_done, 4);
  EXPECT_EQ(second.runs, 6);
  for (const auto& key : second.seen) {
    EXPECT_EQ(std::count(first.seen.begin(), first.seen.end(), key), 0) << "case " << key << " ran twice";
  }
  EXPECT_EQ(ResultRows("nightly-1"), 10);
  EXPECT_EQ(s2->totals.Total(), 10);  // summary covers the whole run

  CountingExecutor third;
  auto s3 = RunUnitStage(*reg_, third, options);
  ASSERT_TRUE(s3.has_value());
  EXPECT_EQ(third.runs, 0);
  EXPECT_EQ(ResultRows("nightly-1"), 10);
  auto finished = reg_->GetRun("nightly-1");
  EXPECT_FALSE((*finished)->finished_at.empty());
}

TEST_F(UnitStage, CostCapRecordsSkippedCasesWithTheReason) {
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "capped";
  options.max_case_flops = 100.0;
  options.progress = false;
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->skipped_by_cost, 3);  // mm with n = 4, 5, 6
  EXPECT_EQ(exec.runs, 7);
  EXPECT_FALSE(s->Failed());
  auto q = reg_->Query("SELECT error FROM results WHERE run_id = 'capped' AND outcome = 'skipped'");
  ASSERT_EQ(q->rows.size(), 3u);
  EXPECT_NE(q->rows[0][0].find("--max-case-flops"), std::string::npos);
}

// --max-case-gb: a case whose replay would hold more memory than the cap
// (inputs and outputs on both sides and the fp64 golden) is skipped with the
// estimate, before anything is allocated.
TEST_F(UnitStage, AMemoryCapSkipsCasesWhoseReplayWouldHoldMore) {
  const OpCase big = testing::MmCase(4096, 4096, 4096);  // f32: 3 x 64 MiB of inputs and output
  auto id = reg_->UpsertCase(big, {1.0, 3.0 * 4096 * 4096 * 4});
  ASSERT_TRUE(id.has_value());
  ASSERT_TRUE(reg_->AddCaseSource(*id, {"m/x", "layers.0", "", "prefill", 0, 1}).ok());
  // 3 sides of 201 MB, and the golden at twice the f32 bytes: about 1.0 GB.
  EXPECT_NEAR(EstimateReplayBytes(big, 3.0 * 4096 * 4096 * 4), 5 * 3.0 * 4096 * 4096 * 4, 1.0);
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "memcap";
  options.max_case_bytes = 0.5e9;
  options.progress = false;
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(exec.runs, 10) << "the ten small cases run";
  EXPECT_EQ(s->skipped_by_cost, 1);
  auto q = reg_->Query("SELECT error FROM results WHERE run_id = 'memcap' AND outcome = 'skipped'");
  ASSERT_EQ(q->rows.size(), 1u);
  EXPECT_NE(q->rows[0][0].find("needs about 1.01 GB to replay"), std::string::npos) << q->rows[0][0];
  EXPECT_NE(q->rows[0][0].find("over --max-case-gb 0.5"), std::string::npos) << q->rows[0][0];
}

TEST_F(UnitStage, ResumeRetriesCasesSkippedByAnEarlierCostCap) {
  CountingExecutor first;
  UnitStageOptions options;
  options.run_id = "grow";
  options.max_case_flops = 100.0;
  options.progress = false;
  ASSERT_TRUE(RunUnitStage(*reg_, first, options).has_value());
  EXPECT_EQ(first.runs, 7);
  CountingExecutor second;
  options.max_case_flops.reset();
  auto s = RunUnitStage(*reg_, second, options);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(second.runs, 3);  // only the three that were over the cap
  EXPECT_EQ(s->totals.counts[Outcome::kPass], 10);
  EXPECT_EQ(ResultRows("grow"), 10);
}

TEST_F(UnitStage, ResumingWithOtherReplayOptionsIsRefused) {
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "judged";
  options.config_json = R"({"replay":{"golden":"auto"}})";
  options.progress = false;
  ASSERT_TRUE(RunUnitStage(*reg_, exec, options).has_value());
  options.config_json = R"({"replay":{"golden":"never"}})";
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("\"never\""), std::string::npos) << s.error().message();
}

TEST_F(UnitStage, FaultyBackendFailsExactlyTheAffectedCases) {
  auto fake = std::make_shared<testing::FakeBackend>();
  fake->add_offset["aten::mul.Tensor"] = 1.0;
  replay::ReplayOptions replay;
  replay.warm_iterations = 1;
  replay::ReplayExecutor exec(fake, replay);
  UnitStageOptions options;
  options.run_id = "faulty";
  options.backend = "fake";
  options.progress = false;
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_TRUE(s->Failed());
  EXPECT_EQ(s->per_op["aten::mul.Tensor"].counts[Outcome::kMismatch], 4);
  EXPECT_EQ(s->per_op["aten::mm"].counts[Outcome::kPass], 6);
  auto q = reg_->Query(
      "SELECT op, max_abs_err, mismatch_frac FROM v_results WHERE run_id = 'faulty' AND outcome = 'mismatch'");
  ASSERT_EQ(q->rows.size(), 4u);
  for (const auto& row : q->rows) {
    EXPECT_EQ(row[0], "aten::mul");
    EXPECT_NEAR(std::stod(row[1]), 1.0, 1e-6);
    EXPECT_DOUBLE_EQ(std::stod(row[2]), 1.0);
  }
}

TEST_F(UnitStage, OpFilterPlansOnlyMatchingCases) {
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "only-mul";
  options.progress = false;
  options.filter.ops = {"mul"};
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->planned, 4);
  EXPECT_EQ(exec.runs, 4);
}

TEST_F(UnitStage, AFilterMatchingNothingIsAnErrorAndCreatesNoRun) {
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "empty";
  options.progress = false;
  options.filter.ops = {"no_such_op"};
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code(), StatusCode::kNotFound);
  EXPECT_FALSE(reg_->GetRun("empty")->has_value());
}

TEST_F(UnitStage, ReusingARunIdForAnotherBackendIsRefused) {
  CountingExecutor exec;
  UnitStageOptions options;
  options.run_id = "r";
  options.backend = "cpu";
  options.progress = false;
  ASSERT_TRUE(RunUnitStage(*reg_, exec, options).has_value());
  options.backend = "cuda";
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_FALSE(s.has_value());
  EXPECT_EQ(s.error().code(), StatusCode::kInvalidArgument);
}

TEST_F(UnitStage, ShardsRunDisjointCasesThatTogetherAreAllOfThem) {
  std::set<std::string> all;
  int64_t planned = 0;
  for (int i = 0; i < 3; ++i) {
    CountingExecutor exec;
    UnitStageOptions options;
    options.run_id = "sharded";
    options.shard = Shard{i, 3};
    options.progress = false;
    auto s = RunUnitStage(*reg_, exec, options);
    ASSERT_TRUE(s.has_value()) << s.error().ToString();
    EXPECT_EQ(s->planned + s->outside_shard, 10);
    planned += s->planned;
    for (const auto& key : exec.seen) {
      EXPECT_TRUE(all.insert(key).second) << key << " ran in two shards";
      EXPECT_TRUE((Shard{i, 3}.Contains(key)));
    }
  }
  EXPECT_EQ(planned, 10);
  EXPECT_EQ(all.size(), 10u);
  // Shards finish their part; the run itself is finished by `coverage merge`.
  EXPECT_TRUE((*reg_->GetRun("sharded"))->finished_at.empty());
  auto shards = reg_->Query("SELECT COUNT(*) FROM run_shards WHERE run_id = 'sharded' AND finished_at IS NOT NULL");
  EXPECT_EQ(shards->rows[0][0], "3");
}

// Looks at the registry while a case runs, and can fail as a harness.
class InspectingExecutor final : public replay::CaseExecutor {
 public:
  explicit InspectingExecutor(registry::Registry& r) : reg(r) {}
  CaseResult Run(const OpCase&) override {
    ++runs;
    in_flight_seen.push_back(reg.InFlight(run_id)->size());
    if (runs == fail_at) harness = Status::Aborted("worker cannot start");
    return CaseResult{};
  }
  Status HarnessStatus() const override { return harness; }
  registry::Registry& reg;
  std::string run_id;
  int runs = 0;
  int fail_at = -1;
  std::vector<size_t> in_flight_seen;
  Status harness;
};

TEST_F(UnitStage, EachCaseIsInFlightWhileItRunsAndClearedWithItsResult) {
  InspectingExecutor exec(*reg_);
  exec.run_id = "flight";
  UnitStageOptions options;
  options.run_id = "flight";
  options.progress = false;
  ASSERT_TRUE(RunUnitStage(*reg_, exec, options).has_value());
  EXPECT_EQ(exec.in_flight_seen, std::vector<size_t>(10, 1));
  EXPECT_TRUE(reg_->InFlight("flight")->empty());
}

TEST_F(UnitStage, AHarnessFailureStopsTheRunWithoutStoringTheCaseAndAResumeRunsIt) {
  InspectingExecutor exec(*reg_);
  exec.run_id = "harness";
  exec.fail_at = 3;
  UnitStageOptions options;
  options.run_id = "harness";
  options.progress = false;
  auto s = RunUnitStage(*reg_, exec, options);
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("worker cannot start"), std::string::npos);
  EXPECT_EQ(ResultRows("harness"), 2);
  EXPECT_EQ(reg_->InFlight("harness")->size(), 1u);

  CountingExecutor again;
  auto resumed = RunUnitStage(*reg_, again, options);
  ASSERT_TRUE(resumed.has_value());
  EXPECT_EQ(resumed->was_in_flight, 1);
  EXPECT_EQ(again.runs, 8);
  EXPECT_EQ(ResultRows("harness"), 10);
  EXPECT_TRUE(reg_->InFlight("harness")->empty());
}

// Note [Case order]: the cases reading one storage (a weight, `t` of it and
// `mm` with its transposed view) run one after the other, whatever their
// keys.
TEST_F(UnitStage, CasesSharingTheirLargestInputRunOneAfterTheOther) {
  TensorSpec w = testing::Spec(DType::kFloat32, {64, 32});
  TensorSpec wt = w;
  wt.shape = {32, 64};
  wt.strides = {1, 32};
  const OpCase t = testing::MakeCase("aten::t", "", {testing::TensorArg("self", w)});
  const OpCase mm1 = testing::MakeCase(
      "aten::mm", "", {testing::TensorArg("self", DType::kFloat32, {2, 32}), testing::TensorArg("mat2", wt)});
  const OpCase mm2 = testing::MakeCase(
      "aten::mm", "", {testing::TensorArg("self", DType::kFloat32, {1, 32}), testing::TensorArg("mat2", wt)});
  const OpCase big = testing::MulCase({64, 64});
  for (const OpCase* c : {&mm1, &t, &big, &mm2}) AddCase(*c, 1.0);
  CountingExecutor exec;
  UnitStageOptions options;
  options.progress = false;
  ASSERT_TRUE(RunUnitStage(*reg_, exec, options).has_value());
  ASSERT_EQ(exec.seen.size(), 14u);
  const auto at = [&](const OpCase& c) { return std::find(exec.seen.begin(), exec.seen.end(), c.Key()) - exec.seen.begin(); };
  const auto lo = std::min({at(t), at(mm1), at(mm2)}), hi = std::max({at(t), at(mm1), at(mm2)});
  EXPECT_EQ(hi - lo, 2) << "t at " << at(t) << ", mm at " << at(mm1) << " and " << at(mm2);
}

}  // namespace
}  // namespace coverage::stages

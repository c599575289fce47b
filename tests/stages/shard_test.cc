#include <map>
#include <set>

#include <gtest/gtest.h>

#include "stages/shard.h"

namespace coverage::stages {
namespace {

using Env = std::map<std::string, std::string>;

Result<std::optional<Shard>> FromEnv(const Env& env, bool engines = true) {
  return ShardFromEnvironment(
      [&](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      engines);
}

TEST(Shard, EveryKeyLandsInExactlyOneShardAndShardsAreBalanced) {
  constexpr int kShards = 7, kKeys = 7000;
  std::map<int, int> sizes;
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "case-" + std::to_string(k);
    int owners = 0;
    for (int i = 0; i < kShards; ++i) {
      if (Shard{i, kShards}.Contains(key)) {
        ++owners;
        ++sizes[i];
      }
    }
    ASSERT_EQ(owners, 1) << key;
  }
  for (const auto& [i, n] : sizes) EXPECT_NEAR(n, kKeys / kShards, kKeys / kShards / 5) << "shard " << i;
}

TEST(Shard, OneShardHoldsEverything) {
  EXPECT_FALSE(Shard{}.active());
  EXPECT_TRUE(Shard{}.Contains("anything"));
}

TEST(Shard, ParsesIOfNAndExplainsBadText) {
  auto s = ParseShard("2/8");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->index, 2);
  EXPECT_EQ(s->count, 8);
  EXPECT_EQ(s->ToString(), "2/8");
  for (const auto& [text, why] : std::vector<std::pair<std::string, std::string>>{
           {"8/8", "outside 0..7"}, {"-1/4", "outside"}, {"1/0", "between 1 and"}, {"1", "of the form i/N"},
           {"a/b", "of the form"}, {"1/4x", "of the form"}}) {
    auto bad = ParseShard(text);
    ASSERT_FALSE(bad.has_value()) << text;
    EXPECT_NE(bad.error().message().find(why), std::string::npos) << bad.error().ToString();
    EXPECT_NE(bad.error().message().find(text), std::string::npos) << bad.error().ToString();
  }
}

TEST(Shard, TheEnvironmentOfEachEngineAssignsTheShard) {
  auto none = FromEnv({});
  ASSERT_TRUE(none.has_value());
  EXPECT_FALSE(none->has_value());

  auto own = FromEnv({{"COVERAGE_SHARD_INDEX", "3"}, {"COVERAGE_TOTAL_SHARDS", "4"}});
  ASSERT_TRUE(own.has_value() && own->has_value());
  EXPECT_EQ((*own)->ToString(), "3/4");

  auto k8s = FromEnv({{"JOB_COMPLETION_INDEX", "5"}, {"COVERAGE_TOTAL_SHARDS", "6"}});
  ASSERT_TRUE(k8s.has_value() && k8s->has_value());
  EXPECT_EQ((*k8s)->ToString(), "5/6");

  // Slurm arrays may start at 1 (--array=1-4): the index is relative to the minimum.
  auto slurm = FromEnv({{"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_COUNT", "4"}, {"SLURM_ARRAY_TASK_MIN", "1"}});
  ASSERT_TRUE(slurm.has_value() && slurm->has_value());
  EXPECT_EQ((*slurm)->ToString(), "3/4");

  // Our own variables win over the engine's.
  auto both = FromEnv({{"COVERAGE_SHARD_INDEX", "0"}, {"COVERAGE_TOTAL_SHARDS", "2"}, {"SLURM_ARRAY_TASK_ID", "1"},
                       {"SLURM_ARRAY_TASK_COUNT", "2"}});
  ASSERT_TRUE(both.has_value() && both->has_value());
  EXPECT_EQ((*both)->index, 0);
}

TEST(Shard, EngineVariablesCountOnlyWhenAskedFor) {
  // A Slurm array task or an Indexed Job pod that runs coverage whole.
  auto slurm = FromEnv({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"}}, /*engines=*/false);
  ASSERT_TRUE(slurm.has_value());
  EXPECT_FALSE(slurm->has_value());
  auto k8s = FromEnv({{"JOB_COMPLETION_INDEX", "1"}, {"COVERAGE_TOTAL_SHARDS", "4"}}, false);
  ASSERT_TRUE(k8s.has_value());
  EXPECT_FALSE(k8s->has_value());
  auto own = FromEnv({{"COVERAGE_SHARD_INDEX", "1"}, {"COVERAGE_TOTAL_SHARDS", "4"}}, false);
  ASSERT_TRUE(own.has_value() && own->has_value());
}

TEST(Shard, SlurmArraysWithAStepMapToConsecutiveShards) {
  // --array=0-14:2 has 8 tasks: ids 0, 2, ..., 14.
  std::set<int> seen;
  for (int id = 0; id <= 14; id += 2) {
    auto s = FromEnv({{"SLURM_ARRAY_TASK_ID", std::to_string(id)}, {"SLURM_ARRAY_TASK_COUNT", "8"},
                      {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_STEP", "2"}});
    ASSERT_TRUE(s.has_value() && s->has_value()) << id;
    seen.insert((*s)->index);
  }
  EXPECT_EQ(seen, (std::set<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(Shard, AnIndexWithoutItsCountOrOutOfRangeIsExplained) {
  auto missing = FromEnv({{"JOB_COMPLETION_INDEX", "1"}});
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message().find("COVERAGE_TOTAL_SHARDS"), std::string::npos);
  auto range = FromEnv({{"SLURM_ARRAY_TASK_ID", "9"}, {"SLURM_ARRAY_TASK_COUNT", "4"}});
  ASSERT_FALSE(range.has_value());
  EXPECT_NE(range.error().message().find("SLURM_ARRAY_TASK_ID=9"), std::string::npos) << range.error().ToString();
  auto text = FromEnv({{"COVERAGE_SHARD_INDEX", "x"}, {"COVERAGE_TOTAL_SHARDS", "2"}});
  ASSERT_FALSE(text.has_value());
  EXPECT_NE(text.error().message().find("not an integer"), std::string::npos);
}

}  // namespace
}  // namespace coverage::stages

// Sharding: one run spread over N processes (a Kubernetes Indexed Job, a
// Slurm array, a CI matrix) with no coordinator. Every work item has a
// stable key (an op case's key; a model's id, so all stages of a model stay
// together for gating); shard i of N runs the items whose
// Mix64(Fnv1a64(key)) % N == i. The assignment depends on the key alone, so
// every item lands in exactly one shard whatever the order, the filters or
// the machine. Shards write their own registry files; `coverage merge`
// (Registry::MergeFrom) puts them back together.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace coverage::stages {

struct Shard {
  int index = 0;
  int count = 1;
  bool active() const { return count > 1; }
  std::string ToString() const;  // "2/8"
  bool Contains(std::string_view key) const;
};

// "i/N" with 0 <= i < N. Errors name the text and what is wrong.
Result<Shard> ParseShard(std::string_view text);

// The shard the environment assigns, in this order:
//   COVERAGE_SHARD_INDEX + COVERAGE_TOTAL_SHARDS   (like GoogleTest's GTEST_SHARD_INDEX / GTEST_TOTAL_SHARDS)
// and, only with `engines` (`--shard auto`: a Slurm array task or an Indexed
// Job pod may run coverage without meaning to shard it):
//   JOB_COMPLETION_INDEX + COVERAGE_TOTAL_SHARDS   (a Kubernetes Indexed Job; the count is the Job's completions)
//   SLURM_ARRAY_TASK_ID  + SLURM_ARRAY_TASK_COUNT  (a Slurm array: (id - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP)
// nullopt when none is set. An index without its count, or values out of
// range, are errors naming the variables. `getenv` is std::getenv in the app.
Result<std::optional<Shard>> ShardFromEnvironment(const std::function<const char*(const char*)>& getenv,
                                                  bool engines);

}  // namespace coverage::stages

// The capture step: runs each seed model's blocks under every input profile
// that applies to its family, with the op observer on, and merges the
// recorded cases into the registry with provenance.
//
// Each (model, profile) pair is committed in one transaction together with a
// `captures` row, so an interrupted capture resumes at the next pair and
// pairs already captured by the same builder version are skipped.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "runners/blocks.h"

namespace coverage::registry {
class Registry;
}

namespace coverage::stages {

// Bump when the blocks change what they execute: captures by older versions
// are redone.
inline constexpr int kBlocksBuilderVersion = 1;

struct CaptureStageOptions {
  std::vector<runners::BlockModel> models;
  std::vector<runners::CaptureProfile> profiles;
  int max_depth = 0;              // see runners::CaptureOptions
  double max_bytes = 8e9;         // refuse a (model, profile) estimated above this (--max-gb)
  bool force = false;             // recapture pairs already captured
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

struct CaptureStageSummary {
  int64_t pairs_captured = 0;
  int64_t pairs_skipped = 0;   // already captured by this builder version
  int64_t pairs_refused = 0;   // over the memory budget, or failed
  int64_t calls = 0;           // recorded calls (before merging)
  int64_t cases_seen = 0;      // distinct cases in the captured pairs
  int64_t cases_new = 0;       // cases the registry did not have
  int64_t cases_pruned = 0;    // cases no capture produces any more (recaptures), without results
  int64_t cases_total = 0;     // cases in the registry afterwards
  bool interrupted = false;
  std::vector<std::string> refusals;            // one line each, with the reason
  std::map<std::string, int64_t> uncaptured;    // calls that could not be described, by reason
};

Result<CaptureStageSummary> RunCaptureStage(registry::Registry& registry, const CaptureStageOptions& options);

}  // namespace coverage::stages

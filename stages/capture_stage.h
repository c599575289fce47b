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

// Capture of a selection's representatives with the config-driven model
// builder (runners/model_builder.h): each representative is planned and,
// when buildable, built from its stored features and config and run under
// every profile whose `families` name its structure ("decoder", "encoder",
// "encoder-decoder", "vision", "conv", "speech"). Every (model, profile)
// gets a `builds` row (built, not built with the reason, or failed with the
// error) committed with its cases in one transaction, so an interrupted
// capture resumes and pairs done by the same builder version are skipped.
struct SelectionCaptureOptions {
  int64_t selection_id = 0;  // 0: the newest selection
  std::vector<std::string> only_models;  // empty: all representatives
  std::vector<runners::CaptureProfile> profiles;
  int64_t max_layers = 2;
  double max_bytes = 8e9;
  bool meta_over_budget = true;  // above max_bytes: capture shapes on meta tensors instead of refusing
  int max_depth = 0;
  bool force = false;
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

struct SelectionCaptureSummary {
  int64_t selection_id = 0;
  int64_t representatives = 0;
  int64_t pairs_built = 0;
  int64_t pairs_not_built = 0;  // the builder does not build it (reason stored)
  int64_t pairs_failed = 0;     // planned but the run failed (error stored)
  int64_t pairs_skipped = 0;    // done before by this builder version
  int64_t pairs_meta = 0;       // of the built ones: captured on meta tensors (over the memory budget)
  int64_t calls = 0;
  int64_t cases_seen = 0;
  int64_t cases_new = 0;
  int64_t cases_total = 0;
  int64_t models_without_profile = 0;  // no selected profile applies (a "(none)" row says so)
  bool interrupted = false;
  std::map<std::string, int64_t> not_built;  // reason -> pairs
};

Result<SelectionCaptureSummary> RunSelectionCapture(registry::Registry& registry, const SelectionCaptureOptions& options);

}  // namespace coverage::stages

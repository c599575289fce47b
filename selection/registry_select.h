// The select step: derive features for every crawled config, then choose K
// representatives (selection/selection.h) and store them.
//
// Feature derivation is incremental and resumable: it handles models whose
// config has no features of the current extractor version, a batch at a
// time, each batch stored in one transaction, so an interrupted run keeps
// what it derived and the next run goes on from there. A changed config
// drops its features (a registry trigger); a new extractor version derives
// all of them again.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"
#include "selection/features.h"
#include "selection/selection.h"

namespace coverage::registry {
class Registry;
}

namespace coverage::selection {

struct FeatureSummary {
  int64_t derived = 0;     // rows written by this call
  int64_t failed = 0;      // of those, configs that could not be read (reasons stored)
  int64_t understood = 0;  // of those, fully understood
  int64_t skipped_changed = 0;  // configs replaced while being read: left for the next run
};

struct DeriveOptions {
  int batch = 2000;
  const std::atomic<bool>* stop = nullptr;  // set: finish the current batch and return Aborted
  std::function<void(int64_t derived)> on_progress;
};

// Errors: database failures; Aborted when `stop` was set (all finished
// batches are stored).
Result<FeatureSummary> DeriveFeatures(registry::Registry& registry, const selection::FamilyDefaults& defaults,
                                      const DeriveOptions& options = {});

struct SelectOptions {
  int k = 841;
  bool per_family = false;  // k = the population's number of coarse signatures (one representative per family)
  uint64_t seed = 0;
  bool store_members = true;  // one selection_members row per model
};

struct SelectSummary {
  int64_t selection_id = 0;
  bool unchanged = false;       // the newest stored selection was this one: nothing was stored again
  int k = 0;                    // the k selected with (options.k, or the families with per_family)
  int64_t failed_features = 0;  // models left out: their config (or stored features) could not be read
  std::vector<std::string> unreadable;  // the first few stored feature rows that did not read back
  selection::Population population;
  selection::Selection selection;
};

// Selects from every model with features of the current version (run
// DeriveFeatures first). Errors: InvalidArgument when there is nothing to
// select from or k < 1; database failures.
Result<SelectSummary> RunSelect(registry::Registry& registry, const SelectOptions& options);

// The coverage figures as JSON (stored in selections.coverage_json).
std::string CoverageJson(const selection::Coverage& coverage);

}  // namespace coverage::selection

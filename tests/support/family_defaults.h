// The real family defaults (data/transformers_defaults.jsonl), loaded once
// per test process. Needs COVERAGE_SOURCE_DIR.
#pragma once

#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "selection/features.h"

namespace coverage::testing {

inline std::shared_ptr<const selection::FamilyDefaults> RealFamilyDefaults() {
  static const auto loaded =
      selection::FamilyDefaults::Load(std::string(COVERAGE_SOURCE_DIR) + "/data/transformers_defaults.jsonl");
  EXPECT_TRUE(loaded.has_value()) << (loaded ? "" : loaded.error().ToString());
  return loaded ? *loaded : selection::FamilyDefaults::Empty();
}

}  // namespace coverage::testing

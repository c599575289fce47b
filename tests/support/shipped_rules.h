// The judging rules the project ships (configs/tolerances.json: per-dtype
// tolerances and the per-op rules), for tests that replay ops whose outputs
// are random or uninitialised.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "replay/compare_options.h"

namespace coverage::testing {

inline replay::ComparisonOptions ShippedComparison() {
  const std::string path = std::string(COVERAGE_SOURCE_DIR) + "/configs/tolerances.json";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  auto rules = replay::ComparisonOptions::FromJson(text.str(), path);
  if (!rules) throw std::runtime_error(rules.error().message());
  return *rules;
}

}  // namespace coverage::testing

// The text of configs/tolerances.json as it was at build time (defined in the
// generated kShippedRulesJson.cc, cmake/embed_file.cmake): the per-op input
// rules are read from it (core/input_rules.h). Internal to core/.
#pragma once

#include <string_view>

namespace coverage {

extern const std::string_view kShippedRulesJson;

}  // namespace coverage

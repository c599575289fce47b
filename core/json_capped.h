// Parsing JSON from outside (Hub pages, config.json files) defensively.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace coverage {

inline constexpr int kMaxJsonDepth = 64;

struct JsonParseOptions {
  int max_depth = kMaxJsonDepth;
  // Python's json module writes NaN, Infinity and -Infinity for float values
  // (transformers does, in some real config.json files). When true, those
  // bare literals outside strings parse as null; otherwise they are invalid.
  bool python_literals = false;
};

// Parses `body`, refusing nesting deeper than max_depth and non-JSON.
// Errors: InvalidArgument with the reason.
Result<nlohmann::json> ParseJsonCapped(std::string_view body, const JsonParseOptions& options = {});

}  // namespace coverage

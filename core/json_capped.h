// Parsing JSON from outside (Hub pages, config.json files) defensively.
#pragma once

#include <optional>
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
// Errors: InvalidArgument for text that is not JSON; Unsupported for JSON
// nested deeper than max_depth (a property of the document, not of a cut
// transfer: the crawl does not fetch it again).
Result<nlohmann::json> ParseJsonCapped(std::string_view body, const JsonParseOptions& options = {});

// Parses a whole file's text (a settings or expectations file a user wrote).
// Errors: InvalidArgument "<source>: not valid JSON: parse error at line L,
// column C: <what was expected>", or the number that overflows a double.
Result<nlohmann::json> ParseJsonText(std::string_view text, std::string_view source);

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string JsonErrorText(const nlohmann::json::exception& e);

// The text of the value of member `key` of the JSON object `object_text`,
// exactly as written (Python's NaN and Infinity included, which a parsed
// nlohmann::json can only write back as null), or nullopt when the text is
// not an object or has no such top-level member. Call it on text that
// ParseJsonCapped accepted: it finds members but does not validate.
std::optional<std::string_view> RawJsonMember(std::string_view object_text, std::string_view key);

}  // namespace coverage

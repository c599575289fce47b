// JSON handled as text, so that real config.json bytes survive unchanged.
// Real configs hold literals that strict JSON parsers reject (Python's json
// writes `Infinity` and `NaN`, e.g. Nemotron-H's "time_step_limit": [0.0,
// Infinity]); a crawler meets them on the Hub, so hub-replay serves them
// verbatim instead of round-tripping through nlohmann::json.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "core/result.h"

namespace coverage::hub_replay {

// `text` with every bare NaN, Infinity and -Infinity outside strings replaced
// by null, for reading fields with a strict parser.
std::string ReplaceNonFiniteLiterals(std::string_view text);

// The text of the value of `key` in the top-level object `text`, nullopt if
// `text` is not an object or has no such key.
std::optional<std::string_view> TopLevelMember(std::string_view text, std::string_view key);

// `text` laid out as Python's json.dumps(..., indent=2) lays it out (what
// transformers writes to config.json): one member or element per line, two
// spaces per level, ": " after keys, empty containers as {} and []. Strings and
// number literals are copied byte for byte. Corruption when brackets do not
// balance or a token is cut off.
Result<std::string> Reindent(std::string_view text);

}  // namespace coverage::hub_replay

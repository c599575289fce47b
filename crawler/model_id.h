// Hub model ids, validated before they are ever used in a URL path, a query
// or a database row. A rejected id is counted and reported by the crawler.
#pragma once

#include <string_view>

#include "core/status.h"

namespace coverage::crawler {

// The Hub's rules (huggingface_hub `validate_repo_id`: REPO_ID_REGEX
// `^(\b[\w\-.]+\b/)?\b[\w\-.]{1,96}\b$`, no "--" or "..", no ".git" suffix),
// restricted to ASCII: an optional namespace and a name separated by at most
// one '/', each made of letters, digits, '_', '-' and '.', each starting and
// ending with a letter, digit or '_', the name at most 96 characters.
// The error names the id and the rule it breaks.
Status ValidateModelId(std::string_view id);

}  // namespace coverage::crawler

// The HTTP `Link` header (RFC 8288) as the Hub uses it for cursor
// pagination: `Link: <https://huggingface.co/api/models?...&cursor=...>; rel="next"`.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace coverage::crawler {

// rel -> URL for every link whose URL is http(s); malformed entries are
// skipped. Accepts several comma-separated links, extra parameters, and
// unquoted or space-separated rel values ("next prev").
std::map<std::string, std::string> ParseLinkHeader(std::string_view header);

// The `rel="next"` URL, if any.
std::optional<std::string> NextPageUrl(std::string_view header);

}  // namespace coverage::crawler

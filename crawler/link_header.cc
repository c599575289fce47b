#include "crawler/link_header.h"

#include <cctype>

#include "crawler/text.h"

namespace coverage::crawler {
namespace {

bool IsHttpUrl(std::string_view url) {
  return url.substr(0, 7) == "http://" || url.substr(0, 8) == "https://";
}

}  // namespace

std::map<std::string, std::string> ParseLinkHeader(std::string_view header) {
  std::map<std::string, std::string> links;
  size_t pos = 0;
  while (pos < header.size()) {
    const size_t open = header.find('<', pos);
    if (open == std::string_view::npos) break;
    const size_t close = header.find('>', open + 1);
    if (close == std::string_view::npos) break;
    const std::string_view url = header.substr(open + 1, close - open - 1);
    // Parameters run to the next '<' that follows a ',' (URLs may hold commas
    // only inside <...>, which this scan skips).
    size_t end = close + 1;
    bool in_quotes = false;
    for (; end < header.size(); ++end) {
      const char c = header[end];
      if (c == '"') in_quotes = !in_quotes;
      if (c == ',' && !in_quotes) break;
    }
    std::string_view params = header.substr(close + 1, end - close - 1);
    pos = end + 1;
    while (!params.empty()) {
      const size_t semi = params.find(';');
      std::string_view param = Trim(params.substr(0, semi));
      params = semi == std::string_view::npos ? std::string_view() : params.substr(semi + 1);
      const size_t eq = param.find('=');
      if (eq == std::string_view::npos || Lower(Trim(param.substr(0, eq))) != "rel") continue;
      std::string_view value = Trim(param.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') value = value.substr(1, value.size() - 2);
      if (!IsHttpUrl(url)) continue;
      // rel may list several space-separated relation types.
      while (!value.empty()) {
        const size_t space = value.find(' ');
        const std::string_view rel = Trim(value.substr(0, space));
        if (!rel.empty()) links.emplace(Lower(rel), std::string(url));
        value = space == std::string_view::npos ? std::string_view() : value.substr(space + 1);
      }
    }
  }
  return links;
}

std::optional<std::string> NextPageUrl(std::string_view header) {
  auto links = ParseLinkHeader(header);
  auto it = links.find("next");
  if (it == links.end()) return std::nullopt;
  return it->second;
}

}  // namespace coverage::crawler

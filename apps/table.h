// A table of strings rendered as aligned text, CSV (RFC 4180) or JSON (an
// array of objects keyed by header). Numbers are passed pre-formatted;
// `numeric` columns are right-aligned and emitted as JSON numbers.
#pragma once

#include <string>
#include <vector>

namespace coverage::apps {

struct Table {
  std::vector<std::string> headers;
  std::vector<bool> numeric;  // per column; missing entries mean text
  std::vector<std::vector<std::string>> rows;

  std::string RenderAligned(size_t max_width = 0) const;  // 0 = no truncation
  std::string RenderCsv() const;
  std::string RenderJson() const;
};

enum class OutputFormat { kTable, kJson, kCsv };

}  // namespace coverage::apps

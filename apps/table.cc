#include "apps/table.h"
#include "core/text_safety.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace coverage::apps {
namespace {

bool IsNumeric(const Table& t, size_t col) { return col < t.numeric.size() && t.numeric[col]; }

// Display width in code points (UTF-8 continuation bytes do not count).
size_t Width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string Truncate(const std::string& s, size_t max_width) {
  if (max_width == 0 || Width(s) <= max_width) return s;
  std::string out;
  size_t w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) != 0x80) {
      if (w + 1 >= max_width) break;
      ++w;
    }
    out.push_back(s[i]);
  }
  return out + "…";
}

}  // namespace

std::string Table::RenderAligned(size_t max_width) const {
  std::vector<size_t> widths(headers.size(), 0);
  auto cell = [&](const std::vector<std::string>& row, size_t c) {
    return c < row.size() ? Truncate(TerminalSafe(row[c]), max_width) : std::string();  // Note [Terminal-safe text]
  };
  for (size_t c = 0; c < headers.size(); ++c) widths[c] = Width(headers[c]);
  for (const auto& row : rows) {
    for (size_t c = 0; c < headers.size(); ++c) widths[c] = std::max(widths[c], Width(cell(row, c)));
  }
  std::string out;
  auto emit = [&](const std::vector<std::string>& row, bool header) {
    std::string line;
    for (size_t c = 0; c < headers.size(); ++c) {
      std::string v = header ? headers[c] : cell(row, c);
      std::string pad(widths[c] - Width(v), ' ');
      if (c) line += "  ";
      line += (IsNumeric(*this, c) && !header) ? pad + v : v + (c + 1 < headers.size() ? pad : "");
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(headers, true);
  std::vector<std::string> rule;
  for (size_t c = 0; c < headers.size(); ++c) rule.push_back(std::string(widths[c], '-'));
  std::string line;
  for (size_t c = 0; c < headers.size(); ++c) line += (c ? "  " : "") + rule[c];
  out += line + "\n";
  for (const auto& row : rows) emit(row, false);
  return out;
}

std::string Table::RenderCsv() const {
  auto quote = [](const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) {
      if (c == '"') q += '"';
      q += c;
    }
    return q + "\"";
  };
  std::string out;
  for (size_t c = 0; c < headers.size(); ++c) out += (c ? "," : "") + quote(headers[c]);
  out += "\r\n";
  for (const auto& row : rows) {
    for (size_t c = 0; c < headers.size(); ++c) out += (c ? "," : "") + quote(c < row.size() ? row[c] : "");
    out += "\r\n";
  }
  return out;
}

std::string Table::RenderJson() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json obj = nlohmann::json::object();
    for (size_t c = 0; c < headers.size(); ++c) {
      const std::string v = c < row.size() ? row[c] : "";
      if (IsNumeric(*this, c) && !v.empty()) {
        nlohmann::json n = nlohmann::json::parse(v, nullptr, false);
        obj[headers[c]] = n.is_discarded() ? nlohmann::json(v) : n;
      } else {
        obj[headers[c]] = v;
      }
    }
    arr.push_back(std::move(obj));
  }
  return arr.dump(2) + "\n";
}

}  // namespace coverage::apps

#include "core/text_safety.h"

#include <algorithm>

namespace coverage {
namespace {

bool IsAsciiAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// A readable form of an offending character for error messages.
std::string Shown(char c) {
  if (c == '\n') return "a newline";
  if (c == '\t') return "a tab";
  const auto u = static_cast<unsigned char>(c);
  if (u < 0x20 || u >= 0x7f) {
    static const char* kHex = "0123456789abcdef";
    return std::string("byte 0x") + kHex[u >> 4] + kHex[u & 15];
  }
  return std::string("'") + c + "'";
}

}  // namespace

Status CheckRunId(std::string_view id, std::string_view what) {
  const std::string prefix = what.empty() ? std::string() : std::string(what) + ": ";
  const std::string shown = "'" + std::string(id.substr(0, 40)) + (id.size() > 40 ? "...'" : "'");
  if (id.empty()) return Status::InvalidArgument(prefix + "a run id cannot be empty");
  if (id.size() > kMaxRunIdLength) {
    return Status::InvalidArgument(prefix + shown + " is not a run id: at most " + std::to_string(kMaxRunIdLength) +
                                   " characters, this one has " + std::to_string(id.size()));
  }
  if (!IsAsciiAlnum(id[0])) {
    return Status::InvalidArgument(prefix + shown + " is not a run id: it must start with a letter or a digit");
  }
  for (char c : id) {
    if (IsAsciiAlnum(c) || c == '.' || c == '_' || c == '-') continue;
    return Status::InvalidArgument(prefix + "run id " + (c == '\n' ? std::string() : shown + " ") + "has " +
                                   Shown(c) + "; use letters, digits, '.', '_' and '-' (it names a report folder)");
  }
  return Status::Ok();
}

std::string ShellQuote(std::string_view s) {
  const bool plain = !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return IsAsciiAlnum(c) || std::string_view("@%_+=:,./-").find(c) != std::string_view::npos;
  });
  if (plain) return std::string(s);
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string SqlQuote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

}  // namespace coverage

#include "core/text_safety.h"

#include <algorithm>
#include <cstdint>

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


std::optional<char32_t> NextUtf8CodePoint(std::string_view text, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b0 = byte(*i);
  const size_t length = b0 < 0x80 ? 1 : (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : (b0 & 0xF8) == 0xF0 ? 4 : 0;
  char32_t cp = length == 1 ? b0 : length == 2 ? (b0 & 0x1F) : length == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  bool valid = length > 0 && *i + length <= text.size();
  for (size_t k = 1; valid && k < length; ++k) {
    valid = (byte(*i + k) & 0xC0) == 0x80;
    cp = (cp << 6) | (byte(*i + k) & 0x3F);
  }
  const char32_t min = length <= 1 ? 0 : length == 2 ? 0x80 : length == 3 ? 0x800 : 0x10000;
  if (!valid || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*i;
    return std::nullopt;
  }
  *i += length;
  return cp;
}

std::string TerminalSafe(std::string_view s, size_t max_bytes) {
  std::string out;
  const bool cut = s.size() > max_bytes;
  if (cut) s = s.substr(0, max_bytes);
  out.reserve(s.size());
  const auto hex = [&](unsigned char b) {
    static const char* digits = "0123456789abcdef";
    out += "\\x";
    out += digits[b >> 4];
    out += digits[b & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const std::optional<char32_t> cp = NextUtf8CodePoint(s, &i);
    // Control characters (C0, DEL, C1) and bytes that are not UTF-8: shown, byte by byte.
    if (!cp || *cp < 0x20 || *cp == 0x7f || (*cp >= 0x80 && *cp <= 0x9f)) {
      for (size_t k = start; k < i; ++k) hex(static_cast<unsigned char>(s[k]));
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  if (cut) out += "...";
  return out;
}

}  // namespace coverage

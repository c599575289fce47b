#include "reports/escape.h"

#include <cstdint>

namespace coverage::reports {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at the start of `s` (1 to 4), or 0
// when it is not one: a stray continuation byte, a truncated sequence, an
// overlong form, a surrogate or a code point past U+10FFFF.
size_t Utf8SequenceLength(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) return 1;
  size_t length = 0;
  uint8_t low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;
    if (b0 == 0xED) high = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;
    if (b0 == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < length) return 0;
  if (byte(1) < low || byte(1) > high) return 0;
  for (size_t i = 2; i < length; ++i) {
    if (byte(i) < 0x80 || byte(i) > 0xBF) return 0;
  }
  return length;
}

}  // namespace

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    switch (c) {
      case '&':
        out += "&amp;";
        ++i;
        continue;
      case '<':
        out += "&lt;";
        ++i;
        continue;
      case '>':
        out += "&gt;";
        ++i;
        continue;
      case '"':
        out += "&quot;";
        ++i;
        continue;
      case '\'':
        out += "&#39;";
        ++i;
        continue;
      default:
        break;
    }
    const auto u = static_cast<uint8_t>(c);
    if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') {
      // Control characters are parse errors in HTML (NUL is dropped or
      // replaced inconsistently); show that something was there.
      out += kReplacement;
      ++i;
      continue;
    }
    if (u == 0x7F) {
      out += kReplacement;
      ++i;
      continue;
    }
    const size_t length = Utf8SequenceLength(text.substr(i));
    if (length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    const std::string_view sequence = text.substr(i, length);
    // Line and paragraph separators are valid HTML text, but written as
    // references they cannot end a line of script when text is copied into one.
    if (sequence == "\xE2\x80\xA8") {
      out += "&#x2028;";
    } else if (sequence == "\xE2\x80\xA9") {
      out += "&#x2029;";
    } else {
      out += sequence;
    }
    i += length;
  }
  return out;
}

}  // namespace coverage::reports

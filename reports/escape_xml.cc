// EscapeXml (reports/escape.h). Kept apart from EscapeHtml: XML needs the
// text decoded, since XML 1.0 cannot hold some characters at all.
#include <cstdint>
#include <cstdio>

#include "core/text_safety.h"
#include "reports/escape.h"

namespace coverage::reports {
namespace {

constexpr char32_t kReplacement = 0xFFFD;

// XML 1.0 Char: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF].
bool IsXmlChar(char32_t c) {
  return c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0xD7FF) || (c >= 0xE000 && c <= 0xFFFD) ||
         (c >= 0x10000 && c <= 0x10FFFF);
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    *out += static_cast<char>(c);
  } else if (c < 0x800) {
    *out += static_cast<char>(0xC0 | (c >> 6));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    *out += static_cast<char>(0xE0 | (c >> 12));
    *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (c >> 18));
    *out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

}  // namespace

// Invalid UTF-8 becomes U+FFFD (the output is always valid UTF-8); characters
// XML cannot hold (most C0 controls, U+FFFE, U+FFFF) are written visibly as
// \xNN or \uNNNN (a NUL in a model id stays seen, Note [Terminal-safe
// text]); CR, LF and tab are written as references, because parsers fold
// CR into LF and an attribute's LF and tab into spaces.
std::string EscapeXml(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (size_t i = 0; i < text.size();) {
    const char32_t c = NextUtf8CodePoint(text, &i).value_or(kReplacement);
    if (!IsXmlChar(c)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : "\\u%04x", static_cast<unsigned>(c));
      out += buf;
      continue;
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\r': out += "&#13;"; break;
      case '\n': out += "&#10;"; break;
      case '\t': out += "&#9;"; break;
      default: AppendUtf8(c, &out);
    }
  }
  return out;
}

}  // namespace coverage::reports

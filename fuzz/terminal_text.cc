// Fuzz target: text from outside shown to a person (Note [Terminal-safe
// text] in core/text_safety.h) and written into JUnit XML (reports/escape.h).
// Invariants: TerminalSafe's output holds no control byte (C0, DEL) and is
// valid UTF-8 without C1 controls; text that is already such UTF-8 comes
// back unchanged; a cut keeps at most max_bytes of the input. EscapeXml's
// output is valid UTF-8 holding only characters XML 1.0 allows, and no
// markup character unescaped.
#include <algorithm>
#include <vector>

#include "core/text_safety.h"
#include "fuzz/fuzz_check.h"
#include "reports/escape.h"

namespace {

using namespace coverage;

// Code points of `s` if it is valid shortest-form UTF-8, else false.
bool DecodeUtf8(std::string_view s, std::vector<uint32_t>* out) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const size_t n = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min = n == 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    out->push_back(cp);
    i += n;
  }
  return true;
}

bool Printable(uint32_t cp) { return cp >= 0x20 && cp != 0x7F && !(cp >= 0x80 && cp <= 0x9F); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string safe = TerminalSafe(text);
  std::vector<uint32_t> cps;
  FUZZ_CHECK(DecodeUtf8(safe, &cps), "TerminalSafe gave invalid UTF-8");
  for (uint32_t cp : cps) FUZZ_CHECK(Printable(cp), "TerminalSafe let a control character through");
  std::vector<uint32_t> in;
  if (DecodeUtf8(text, &in) && std::all_of(in.begin(), in.end(), Printable)) {
    FUZZ_CHECK(safe == text, "printable UTF-8 was changed");
  }
  const size_t max = size / 2;
  const std::string cut = TerminalSafe(text, max);
  if (size > max) FUZZ_CHECK(cut.size() >= 3 && cut.compare(cut.size() - 3, 3, "...") == 0, "a cut says so");

  const std::string xml = reports::EscapeXml(text);
  std::vector<uint32_t> xs;
  FUZZ_CHECK(DecodeUtf8(xml, &xs), "EscapeXml gave invalid UTF-8");
  for (uint32_t cp : xs) {
    const bool xml_char = cp == 0x9 || cp == 0xA || cp == 0xD || (cp >= 0x20 && cp <= 0xD7FF) ||
                          (cp >= 0xE000 && cp <= 0xFFFD) || (cp >= 0x10000 && cp <= 0x10FFFF);
    FUZZ_CHECK(xml_char, "EscapeXml wrote a character XML 1.0 cannot hold");
    FUZZ_CHECK(cp != '<' && cp != '>' && cp != '"' && cp != '\'', "EscapeXml left markup unescaped");
  }
  return 0;
}

#include "tools/hub-replay/cursor.h"

#include <nlohmann/json.hpp>

namespace coverage::hub_replay {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int DecodeChar(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

}  // namespace

std::string Base64UrlEncode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  uint32_t buffer = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    buffer = (buffer << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out += kAlphabet[(buffer >> bits) & 63];
    }
  }
  if (bits > 0) out += kAlphabet[(buffer << (6 - bits)) & 63];
  return out;
}

std::optional<std::string> Base64UrlDecode(std::string_view text) {
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    const int v = DecodeChar(c);
    if (v < 0) return std::nullopt;
    buffer = (buffer << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xff);
    }
  }
  // Leftover bits must be zero, so each byte string has exactly one encoding.
  if ((buffer & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

std::string EncodeCursor(const Cursor& cursor) {
  nlohmann::ordered_json j;
  j["s"] = cursor.sort;
  j["d"] = cursor.direction;
  if (cursor.position >= 0) {
    j["p"] = cursor.position;
  } else {
    j["k"] = cursor.key;
    j["i"] = cursor.index;
  }
  return Base64UrlEncode(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

std::optional<Cursor> DecodeCursor(std::string_view text) {
  if (text.empty() || text.size() > 4096) return std::nullopt;
  const std::optional<std::string> raw = Base64UrlDecode(text);
  if (!raw) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(*raw, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  const auto s = j.find("s");
  const auto d = j.find("d");
  if (s == j.end() || !s->is_string() || d == j.end() || !d->is_number_integer()) return std::nullopt;
  Cursor cursor;
  cursor.sort = s->get<std::string>();
  const int64_t direction = d->get<int64_t>();
  if (direction != -1 && direction != 1) return std::nullopt;
  cursor.direction = static_cast<int>(direction);
  const auto p = j.find("p");
  const auto k = j.find("k");
  const auto i = j.find("i");
  if (p != j.end()) {
    if (!p->is_number_integer() || p->get<int64_t>() < 0 || k != j.end() || i != j.end()) return std::nullopt;
    cursor.position = p->get<int64_t>();
  } else {
    if (k == j.end() || !k->is_string() || i == j.end() || !i->is_number_integer() || i->get<int64_t>() < 0) {
      return std::nullopt;
    }
    cursor.key = k->get<std::string>();
    cursor.index = i->get<int64_t>();
  }
  return cursor;
}

}  // namespace coverage::hub_replay

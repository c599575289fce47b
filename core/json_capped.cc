#include "core/json_capped.h"

#include <string>

namespace coverage {

namespace {

// Length of the Python literal at body[i] (NaN, Infinity, -Infinity), or 0.
size_t PythonLiteralAt(std::string_view body, size_t i) {
  for (std::string_view lit : {std::string_view("NaN"), std::string_view("Infinity"), std::string_view("-Infinity")}) {
    if (body.substr(i, lit.size()) == lit) return lit.size();
  }
  return 0;
}

}  // namespace

Result<nlohmann::json> ParseJsonCapped(std::string_view body, const JsonParseOptions& options) {
  // One byte scan for the nesting depth (outside strings) before parsing:
  // cheaper than nlohmann's callback parser, which is slow on large objects.
  // The same scan finds Python's non-finite literals.
  int depth = 0;
  bool in_string = false, escaped = false, has_literals = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > options.max_depth) {
        return Status::InvalidArgument("JSON nested deeper than " + std::to_string(options.max_depth) + " levels");
      }
    } else if (c == ']' || c == '}') {
      --depth;
    } else if (options.python_literals && (c == 'N' || c == 'I' || c == '-') && PythonLiteralAt(body, i) > 0) {
      has_literals = true;
    }
  }
  if (!has_literals) {
    nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status::InvalidArgument("body is not valid JSON");
    return j;
  }
  // Rewrite the literals outside strings as null, then parse.
  std::string text;
  text.reserve(body.size());
  in_string = escaped = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      text += c;
      continue;
    }
    if (c == '"') in_string = true;
    if (const size_t n = (c == 'N' || c == 'I' || c == '-') ? PythonLiteralAt(body, i) : 0; n > 0) {
      text += "null";
      i += n - 1;
      continue;
    }
    text += c;
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("body is not valid JSON");
  return j;
}

}  // namespace coverage

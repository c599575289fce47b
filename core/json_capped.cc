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

// Where a scan of JSON text is: inside a string (after a backslash in it)
// or not. The three scans below share it.
struct StringState {
  bool in_string = false, escaped = false;
  // Advances over `c`; true when `c` belongs to a string, its quotes included.
  bool Inside(char c) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      return true;
    }
    if (c == '"') in_string = true;
    return in_string;
  }
};

}  // namespace

Result<nlohmann::json> ParseJsonCapped(std::string_view body, const JsonParseOptions& options) {
  // One byte scan for the nesting depth (outside strings) before parsing:
  // cheaper than nlohmann's callback parser, which is slow on large objects.
  // The same scan finds Python's non-finite literals.
  int depth = 0;
  bool has_literals = false;
  StringState scan;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (scan.Inside(c)) continue;
    if (c == '[' || c == '{') {
      if (++depth > options.max_depth) {
        return Status::Unsupported("JSON nested deeper than " + std::to_string(options.max_depth) + " levels");
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
  scan = StringState();
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (scan.Inside(c)) {
      text += c;
      continue;
    }
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

std::string JsonErrorText(const nlohmann::json::exception& e) {
  std::string_view what = e.what();
  if (what.starts_with("[json.exception.")) {
    if (const size_t end = what.find("] "); end != std::string_view::npos) what.remove_prefix(end + 2);
  }
  return std::string(what);
}

Result<nlohmann::json> ParseJsonText(std::string_view text, std::string_view source) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for 1E666
    return Status::InvalidArgument(std::string(source) + ": not valid JSON: " + JsonErrorText(e));
  }
}

std::optional<std::string_view> RawJsonMember(std::string_view text, std::string_view key) {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r')) ++i;
  };
  // One value from i (string, number, literal, or nested container); returns
  // false on text that ends inside it.
  auto skip_value = [&]() -> bool {
    int depth = 0;
    StringState scan;
    for (; i < text.size(); ++i) {
      const char c = text[i];
      const bool was_in_string = scan.in_string;
      if (scan.Inside(c)) {
        if (was_in_string && !scan.in_string && depth == 0) {  // a string value ends
          ++i;
          return true;
        }
        continue;
      }
      if (c == '[' || c == '{') {
        ++depth;
      } else if (c == ']' || c == '}') {
        if (depth == 0) return true;  // the end of the enclosing object
        if (--depth == 0) {
          ++i;
          return true;
        }
      } else if (depth == 0 && c == ',') {
        return true;
      }
    }
    return depth == 0 && !scan.in_string;
  };
  skip_space();
  if (i >= text.size() || text[i] != '{') return std::nullopt;
  ++i;
  while (true) {
    skip_space();
    if (i >= text.size() || text[i] != '"') return std::nullopt;
    const size_t name_start = i;
    if (!skip_value()) return std::nullopt;
    // The member name as written, quotes stripped; names with escapes never
    // match, which is fine for the plain keys callers ask for.
    const std::string_view name = text.substr(name_start + 1, i - name_start - 2);
    skip_space();
    if (i >= text.size() || text[i] != ':') return std::nullopt;
    ++i;
    skip_space();
    const size_t value_start = i;
    if (!skip_value()) return std::nullopt;
    size_t value_end = i;
    while (value_end > value_start && (text[value_end - 1] == ' ' || text[value_end - 1] == '\t' ||
                                       text[value_end - 1] == '\n' || text[value_end - 1] == '\r')) {
      --value_end;
    }
    if (name == key) return text.substr(value_start, value_end - value_start);
    skip_space();
    if (i >= text.size() || text[i] != ',') return std::nullopt;
    ++i;
  }
}

}  // namespace coverage

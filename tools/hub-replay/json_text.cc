#include "tools/hub-replay/json_text.h"

#include <algorithm>
#include <vector>

namespace coverage::hub_replay {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsStructural(char c) { return c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == ':'; }

// Splits JSON text into tokens: structural characters, whole strings (quotes
// and escapes included) and scalar runs (numbers, true, false, null, NaN...).
class Tokenizer {
 public:
  explicit Tokenizer(std::string_view text) : text_(text) {}

  // The next token, "" at the end; nullopt for an unterminated string.
  std::optional<std::string_view> Next() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
    if (pos_ >= text_.size()) return std::string_view();
    const size_t start = pos_;
    const char c = text_[pos_];
    if (IsStructural(c)) {
      ++pos_;
    } else if (c == '"') {
      ++pos_;
      while (pos_ < text_.size() && text_[pos_] != '"') pos_ += text_[pos_] == '\\' ? 2 : 1;
      if (pos_ >= text_.size()) return std::nullopt;
      ++pos_;
    } else {
      while (pos_ < text_.size() && !IsSpace(text_[pos_]) && !IsStructural(text_[pos_]) && text_[pos_] != '"') ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  std::optional<std::string_view> Peek() {
    const size_t saved = pos_;
    auto token = Next();
    pos_ = saved;
    return token;
  }

  size_t position() const { return pos_; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

// Skips one complete value whose first token was just read; false if cut off.
bool SkipValue(Tokenizer& t, std::string_view first) {
  if (first != "{" && first != "[") return !first.empty() && first != "}" && first != "]" && first != ",";
  int depth = 1;
  while (depth > 0) {
    const auto token = t.Next();
    if (!token || token->empty()) return false;
    if (*token == "{" || *token == "[") ++depth;
    if (*token == "}" || *token == "]") --depth;
  }
  return true;
}

}  // namespace

std::string ReplaceNonFiniteLiterals(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < text.size() && text[j] != '"') j += text[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, text.size());
      out.append(text.substr(i, j - i));
      i = j;
      continue;
    }
    bool replaced = false;
    for (std::string_view literal : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, literal.size()) == literal) {
        out += "null";
        i += literal.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

std::optional<std::string_view> TopLevelMember(std::string_view text, std::string_view key) {
  Tokenizer t(text);
  auto token = t.Next();
  if (!token || *token != "{") return std::nullopt;
  while (true) {
    const auto name = t.Next();
    if (!name || name->empty() || *name == "}") return std::nullopt;
    const auto colon = t.Next();
    if (!colon || *colon != ":") return std::nullopt;
    // The value starts at the next token; remember where.
    const auto first = t.Peek();
    if (!first || first->empty()) return std::nullopt;
    const size_t start = static_cast<size_t>(first->data() - text.data());
    t.Next();
    if (!SkipValue(t, *first)) return std::nullopt;
    if (name->size() == key.size() + 2 && name->substr(1, key.size()) == key) {
      return text.substr(start, t.position() - start);
    }
    const auto sep = t.Next();
    if (!sep || (*sep != "," && *sep != "}")) return std::nullopt;
    if (*sep == "}") return std::nullopt;
  }
}

Result<std::string> Reindent(std::string_view text) {
  Tokenizer t(text);
  std::string out;
  out.reserve(text.size() * 2);
  std::vector<char> open;  // '{' or '['
  auto newline = [&out, &open]() {
    out += '\n';
    out.append(2 * open.size(), ' ');
  };
  bool done = false;
  while (true) {
    const auto token = t.Next();
    if (!token) return Status::Corruption("JSON text has an unterminated string");
    if (token->empty()) break;
    if (done) return Status::Corruption("JSON text has more than one value");
    const char c = token->front();
    if (c == '{' || c == '[') {
      const auto next = t.Peek();
      if (next && !next->empty() && next->front() == (c == '{' ? '}' : ']')) {
        t.Next();
        out += c == '{' ? "{}" : "[]";
        done = open.empty();
      } else {
        out += c;
        open.push_back(c);
        newline();
      }
    } else if (c == '}' || c == ']') {
      if (open.empty() || open.back() != (c == '}' ? '{' : '[')) {
        return Status::Corruption("JSON text has unbalanced brackets");
      }
      open.pop_back();
      newline();
      out += c;
      done = open.empty();
    } else if (c == ',') {
      if (open.empty()) return Status::Corruption("JSON text has a ',' outside any container");
      out += ',';
      newline();
    } else if (c == ':') {
      out += ": ";
    } else {
      out.append(*token);
      done = open.empty();
    }
  }
  if (!open.empty()) return Status::Corruption("JSON text ends inside a container");
  return out;
}

}  // namespace coverage::hub_replay

#include "selection/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

namespace coverage::selection::detail {

bool OneOf(std::string_view s, Names names) { return std::find(names.begin(), names.end(), s) != names.end(); }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool Contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

const json* Member(const json* object, std::string_view key) {
  if (object == nullptr || !object->is_object()) return nullptr;
  auto it = object->find(key);
  return it == object->end() ? nullptr : &*it;
}

const json* Object(const json* object, std::string_view key) {
  const json* v = Member(object, key);
  return v != nullptr && v->is_object() ? v : nullptr;
}

std::optional<int64_t> AsCount(const json* v) {
  if (v == nullptr) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u == 0 || u > static_cast<uint64_t>(kMaxCount)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    if (i <= 0 || i > kMaxCount) return std::nullopt;
    return i;
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || d < 1 || d > static_cast<double>(kMaxCount) || d != std::floor(d)) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::optional<double> AsNumber(const json* v) {
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<bool> AsBool(const json* v) {
  if (v == nullptr || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<std::string> AsText(const json* v) {
  if (v == nullptr || !v->is_string()) return std::nullopt;
  const std::string& s = v->get_ref<const std::string&>();
  if (s.empty() || s.size() > kMaxText) return std::nullopt;
  return s;
}

std::vector<int64_t> AsCountList(const json* v) {
  std::vector<int64_t> out;
  if (v == nullptr || !v->is_array() || v->size() > kMaxList) return out;
  for (const json& e : *v) {
    auto c = AsCount(&e);
    if (!c) return {};
    out.push_back(*c);
  }
  return out;
}

std::string AsToken(const json* v) {
  auto s = AsText(v);
  if (!s || s->size() > 64) return "";
  std::string out = Lower(*s);
  for (char c : out) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return "";
  }
  return out;
}

// ---------------------------------------------------------------------------
// Reader

Reader::Reader(Scope scope, std::vector<std::string>* defaulted) : scope_(std::move(scope)), defaulted_(defaulted) {}

std::optional<int64_t> Reader::Count(std::string_view canonical, Names aliases) {
  Found f = Resolve(canonical, aliases);
  auto c = AsCount(f.value);
  if (c && f.from_defaults) NoteDefault(canonical);
  return c;
}

std::optional<bool> Reader::Bool(std::string_view canonical, Names aliases) {
  Found f = Resolve(canonical, aliases);
  auto b = AsBool(f.value);
  if (b && f.from_defaults) NoteDefault(canonical);
  return b;
}

std::optional<double> Reader::Number(std::string_view canonical, Names aliases) {
  Found f = Resolve(canonical, aliases);
  auto d = AsNumber(f.value);
  if (d && f.from_defaults) NoteDefault(canonical);
  return d;
}

const json* Reader::Value(std::string_view canonical, Names aliases, bool* from_defaults) {
  Found f = Resolve(canonical, aliases);
  *from_defaults = f.from_defaults;
  return f.value;
}

bool Reader::Mentions(std::string_view key) const {
  if (Member(scope_.config, key) != nullptr || Member(scope_.fallback, key) != nullptr) return true;
  return scope_.family != nullptr && Member(scope_.family->defaults.get(), key) != nullptr;
}

const json* Reader::Raw(std::string_view key) const {
  if (const json* v = Member(scope_.config, key)) return v;
  return Member(scope_.fallback, key);
}

void Reader::NoteDefault(std::string_view canonical) {
  std::string name = scope_.prefix + std::string(canonical);
  if (std::find(defaulted_->begin(), defaulted_->end(), name) == defaulted_->end()) defaulted_->push_back(name);
}

Reader::Found Reader::Resolve(std::string_view canonical, Names aliases) const {
  std::vector<std::string_view> names{canonical};
  if (scope_.family != nullptr) {
    if (auto it = scope_.family->attribute_map.find(std::string(canonical));
        it != scope_.family->attribute_map.end()) {
      names.push_back(it->second);
    }
  }
  names.insert(names.end(), aliases.begin(), aliases.end());
  for (const json* object : {scope_.config, scope_.fallback}) {
    bool named_as_null = false;
    for (std::string_view name : names) {
      const json* v = Member(object, name);
      if (v == nullptr) continue;
      if (!v->is_null()) return {v, false};
      named_as_null = true;
    }
    if (named_as_null) return {};
  }
  if (scope_.family != nullptr) {
    for (std::string_view name : names) {
      const json* v = Member(scope_.family->defaults.get(), name);
      if (v == nullptr) continue;
      if (v->is_null()) return {};
      return {v, true};
    }
  }
  return {};
}

}  // namespace coverage::selection::detail

#include "core/json_fields.h"

#include <algorithm>
#include <optional>

#include "core/json_double.h"

namespace coverage {

using json = nlohmann::json;

JsonFields::JsonFields(const json& object, std::string what, StatusCode code)
    : j_(object), what_(std::move(what)), code_(code) {}

Status JsonFields::NotObject() const { return Status(code_, what_ + ": expected a JSON object"); }

Status JsonFields::Error(const char* key, const std::string& message) const {
  return Status(code_, what_ + "." + key + ": " + message);
}

bool JsonFields::Has(const char* key) const { return Find(key) != nullptr; }

const json* JsonFields::Find(const char* key) const {
  if (!j_.is_object()) return nullptr;
  auto it = j_.find(key);
  return it == j_.end() || it->is_null() ? nullptr : &*it;
}

Status JsonFields::Require(const char* key) const {
  if (!j_.is_object()) return NotObject();
  return Find(key) ? Status::Ok() : Error(key, "missing");
}

JsonFields JsonFields::Sub(const char* key, const json& member) const {
  return JsonFields(member, what_ + "." + key, code_);
}

Status JsonFields::Integer(const char* key, int64_t lo, uint64_t hi, int64_t* out, bool* present) const {
  if (!j_.is_object()) return NotObject();
  const json* v = Find(key);
  *present = v != nullptr;
  if (!v) return Status::Ok();
  bool fits = false;
  if (v->is_number_unsigned()) {  // nlohmann reads every non-negative whole number as unsigned
    const uint64_t u = v->get<uint64_t>();
    fits = u <= hi && (lo <= 0 || u >= static_cast<uint64_t>(lo));
  } else if (v->is_number_integer()) {
    const int64_t i = v->get<int64_t>();
    fits = i >= lo && (i < 0 || static_cast<uint64_t>(i) <= hi);
  }
  if (!fits) return Error(key, "expected a whole number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " + v->dump());
  *out = v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
  return Status::Ok();
}

// A member converted by `convert` (nullopt: it is not what `expected` says).
template <typename T, typename Convert>
Status JsonFields::Scalar(const char* key, const char* expected, T* out, Convert convert) const {
  if (!j_.is_object()) return NotObject();
  const json* v = Find(key);
  if (!v) return Status::Ok();
  std::optional<T> value = convert(*v);
  if (!value) return Error(key, std::string("expected ") + expected + ", not " + v->dump());
  *out = std::move(*value);
  return Status::Ok();
}

Status JsonFields::Double(const char* key, double* out) const {
  return Scalar(key, "a number", out, [](const json& v) { return DoubleFromJson(v); });
}

Status JsonFields::OptionalDouble(const char* key, std::optional<double>* out) const {
  const json* v = Find(key);
  double d = 0;
  if (Status s = Double(key, &d); !s.ok()) return s;
  if (v) *out = d;
  return Status::Ok();
}

Status JsonFields::String(const char* key, std::string* out) const {
  return Scalar(key, "a string", out, [](const json& v) -> std::optional<std::string> {
    if (!v.is_string()) return std::nullopt;
    return v.get<std::string>();
  });
}

Status JsonFields::Bool(const char* key, bool* out) const {
  return Scalar(key, "true or false", out, [](const json& v) -> std::optional<bool> {
    if (!v.is_boolean()) return std::nullopt;
    return v.get<bool>();
  });
}

// An array member, each element converted by `convert` (nullopt: the element
// is not what `expected` says).
template <typename T, typename Convert>
Status JsonFields::Array(const char* key, const char* expected, std::vector<T>* out, Convert convert) const {
  if (!j_.is_object()) return NotObject();
  const json* v = Find(key);
  if (!v) return Status::Ok();
  if (!v->is_array()) return Error(key, std::string("expected an array of ") + expected);
  std::vector<T> items;
  items.reserve(v->size());
  for (const json& e : *v) {
    std::optional<T> item = convert(e);
    if (!item) return Error(key, std::string("expected an array of ") + expected + ", found " + e.dump());
    items.push_back(std::move(*item));
  }
  *out = std::move(items);
  return Status::Ok();
}

Status JsonFields::Ints(const char* key, std::vector<int64_t>* out) const {
  return Array(key, "integers", out, [](const json& e) -> std::optional<int64_t> {
    if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX)) return std::nullopt;
    return e.get<int64_t>();
  });
}

Status JsonFields::Strings(const char* key, std::vector<std::string>* out) const {
  return Array(key, "strings", out, [](const json& e) -> std::optional<std::string> {
    if (!e.is_string()) return std::nullopt;
    return e.get<std::string>();
  });
}

Status JsonFields::Doubles(const char* key, std::vector<double>* out) const {
  return Array(key, "numbers", out, [](const json& e) { return DoubleFromJson(e); });
}

Status JsonFields::Bools(const char* key, std::vector<bool>* out) const {
  return Array(key, "booleans", out, [](const json& e) -> std::optional<bool> {
    if (!e.is_boolean()) return std::nullopt;
    return e.get<bool>();
  });
}

Status JsonFields::Outcomes(const char* key, std::vector<Outcome>* out) const {
  return Array(key, "outcomes", out, [](const json& e) -> std::optional<Outcome> {
    return e.is_string() ? OutcomeFromName(e.get<std::string>()) : std::nullopt;
  });
}

Status JsonFields::OnlyMembers(std::initializer_list<const char*> known) const {
  if (!j_.is_object()) return NotObject();
  for (const auto& member : j_.items()) {
    const std::string& key = member.key();
    if (std::find_if(known.begin(), known.end(), [&](const char* k) { return key == k; }) != known.end()) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    return Error(key.c_str(), "unknown member (expected " + names + ")");
  }
  return Status::Ok();
}

Status JsonFields::OutcomeField(const char* key, Outcome* out) const {
  return Scalar(key, "an outcome name", out, [](const json& v) -> std::optional<Outcome> {
    return v.is_string() ? OutcomeFromName(v.get<std::string>()) : std::nullopt;
  });
}

Status JsonFields::Object(const char* key, json* out) const {
  return Scalar(key, "a JSON object", out, [](const json& v) -> std::optional<json> {
    if (!v.is_object()) return std::nullopt;
    return v;
  });
}

Status JsonFields::RequiredString(const char* key, std::string* out) const {
  COV_RETURN_IF_ERROR(Require(key));
  return String(key, out);
}

Status JsonFields::RequiredDouble(const char* key, double* out) const {
  COV_RETURN_IF_ERROR(Require(key));
  return Double(key, out);
}

Status JsonFields::RequiredOutcome(const char* key, Outcome* out) const {
  COV_RETURN_IF_ERROR(Require(key));
  return OutcomeField(key, out);
}

}  // namespace coverage

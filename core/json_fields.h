// JsonFields: the one reader of a record's members from JSON. Op cases,
// programs' traces, case and model-item results and worker messages all read
// their members through it, so a member that is missing, of another type
// than written, or out of range is a Status naming the source and the
// member ("op case JSON.args[2].shape: expected an array of integers"),
// never an exception from nlohmann's get() or an undefined cast of 1e33 to
// int (fuzz/ found both).
//
// Optional members leave *out untouched when absent or null (so a default
// set before the call stays); Required* fail when the member is absent or
// null. Torch-free.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/outcome.h"
#include "core/status.h"

namespace coverage {

class JsonFields {
 public:
  // `what` names the object in errors; `code` is the error's code
  // (Corruption for stored data, InvalidArgument for a user's request).
  // An object that is not a JSON object is an error at the first read.
  // It reads `object` in place: the object must outlive the reader.
  JsonFields(const nlohmann::json& object, std::string what, StatusCode code = StatusCode::kCorruption);
  JsonFields(nlohmann::json&& object, std::string what, StatusCode code = StatusCode::kCorruption) = delete;

  const std::string& what() const { return what_; }
  bool Has(const char* key) const;  // present and not null
  // An error unless the member is present and not null.
  Status Require(const char* key) const;
  // The member itself (nullptr when absent or null), for members with a
  // structure of their own; Sub reads one with the same source and code.
  const nlohmann::json* Find(const char* key) const;
  JsonFields Sub(const char* key, const nlohmann::json& member) const;
  // An error about `key` ("<what>.<key>: <message>").
  Status Error(const char* key, const std::string& message) const;

  // A whole JSON number in [lo, hi].
  template <typename T>
  Status Int(const char* key, T* out, T lo = std::numeric_limits<T>::min(),
             T hi = std::numeric_limits<T>::max()) const {
    int64_t v = 0;
    bool present = false;
    if (Status s = Integer(key, static_cast<int64_t>(lo), static_cast<uint64_t>(hi), &v, &present); !s.ok()) return s;
    if (present) *out = static_cast<T>(v);
    return Status::Ok();
  }
  // A number, or "inf", "-inf", "nan" (core/json_double.h).
  Status Double(const char* key, double* out) const;
  // As Double; null leaves it empty.
  Status OptionalDouble(const char* key, std::optional<double>* out) const;
  Status String(const char* key, std::string* out) const;
  Status Bool(const char* key, bool* out) const;
  Status Ints(const char* key, std::vector<int64_t>* out) const;
  Status Strings(const char* key, std::vector<std::string>* out) const;
  Status Doubles(const char* key, std::vector<double>* out) const;  // each as Double reads it
  Status Bools(const char* key, std::vector<bool>* out) const;
  Status OutcomeField(const char* key, Outcome* out) const;
  Status Outcomes(const char* key, std::vector<Outcome>* out) const;
  // A JSON object member, kept as a value.
  Status Object(const char* key, nlohmann::json* out) const;

  template <typename T>
  Status RequiredInt(const char* key, T* out, T lo = std::numeric_limits<T>::min(),
                     T hi = std::numeric_limits<T>::max()) const {
    if (Status s = Require(key); !s.ok()) return s;
    return Int(key, out, lo, hi);
  }
  Status RequiredDouble(const char* key, double* out) const;
  // An error naming the first member not in `known` (a misspelt key in a
  // hand-written file).
  Status OnlyMembers(std::initializer_list<const char*> known) const;
  Status RequiredString(const char* key, std::string* out) const;
  Status RequiredOutcome(const char* key, Outcome* out) const;

 private:
  Status NotObject() const;
  Status Integer(const char* key, int64_t lo, uint64_t hi, int64_t* out, bool* present) const;
  template <typename T, typename Convert>
  Status Scalar(const char* key, const char* expected, T* out, Convert convert) const;
  template <typename T, typename Convert>
  Status Array(const char* key, const char* expected, std::vector<T>* out, Convert convert) const;

  const nlohmann::json& j_;
  std::string what_;
  StatusCode code_;
};

}  // namespace coverage

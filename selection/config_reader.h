// Reading an untrusted config.json: checked accessors for single values
// (Note [Untrusted configs]) and Reader, which resolves a canonical field of
// one config object through its family's aliases and defaults. Internal to
// selection/ (the steps of ExtractFeatures share it).
//
// Thread safety: the accessors are pure; a Reader appends to the `defaulted`
// list it was given and belongs to one extraction.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "selection/features.h"

namespace coverage::selection::detail {

using json = nlohmann::json;
using Family = FamilyDefaults::Family;
using Names = std::initializer_list<std::string_view>;

// Note [Untrusted configs]
// A config.json comes from anyone. Every read goes through Member, AsCount,
// AsBool, AsText or AsCountList, which answer "unknown" for a missing member,
// a wrong type, a count that is not positive or is beyond 2^40, or an
// overlong string. Nothing here calls nlohmann's throwing accessors
// (`at`, `get<T>` on an unchecked value) or `operator[]` on input data, and
// nothing recurses into the input, so nesting depth cannot hurt.
constexpr int64_t kMaxCount = int64_t{1} << 40;
constexpr size_t kMaxText = 256;
constexpr size_t kMaxList = 4096;

bool OneOf(std::string_view s, Names names);
std::string Lower(std::string_view s);
bool StartsWith(std::string_view s, std::string_view prefix);
bool Contains(std::string_view s, std::string_view part);

// The member `key` of `object`; null when `object` is null or not an object,
// or has no such member.
const json* Member(const json* object, std::string_view key);
// The same, only when the member is an object.
const json* Object(const json* object, std::string_view key);

// A positive count or size up to kMaxCount; integral floats (768.0) are
// accepted.
std::optional<int64_t> AsCount(const json* v);
// A finite number.
std::optional<double> AsNumber(const json* v);
std::optional<bool> AsBool(const json* v);
// A non-empty string of at most kMaxText characters.
std::optional<std::string> AsText(const json* v);
// A list of positive counts; anything else (a wrong element, an overlong
// list) is unknown and gives an empty list.
std::vector<int64_t> AsCountList(const json* v);
// A name from the vocabulary of a config (an activation, a rope type, a quant
// method), lowercased: letters, digits, '_', '-' and '.', at most 64 chars;
// "" otherwise.
std::string AsToken(const json* v);

// What one Reader reads.
struct Scope {
  const json* config = nullptr;    // read first; always an object
  const json* fallback = nullptr;  // read next (the top level of a nested text config), may be null
  const Family* family = nullptr;  // whose aliases and defaults apply; null when unknown
  std::string prefix;              // for Features::defaulted: "" or "text_config."
};

// One config object with its family's aliases and defaults. A value taken
// from the defaults is recorded (once) in the `defaulted` list, under the
// scope's prefix.
class Reader {
 public:
  Reader(Scope scope, std::vector<std::string>* defaulted);

  const Family* family() const { return scope_.family; }
  std::string family_name() const { return scope_.family != nullptr ? scope_.family->model_type : ""; }
  const json* config() const { return scope_.config; }

  // The value of `canonical`: from the config (under its own name, the
  // family's alias or a common alias), then the fallback, then the family's
  // defaults. An explicit null stops the search (transformers would derive
  // the value), as does a value of the wrong type (it reads as unknown).
  std::optional<int64_t> Count(std::string_view canonical, Names aliases = {});
  std::optional<bool> Bool(std::string_view canonical, Names aliases = {});
  std::optional<double> Number(std::string_view canonical, Names aliases = {});
  // The raw value (not null) with where it came from; the caller decides
  // whether to record it as defaulted (NoteDefault).
  const json* Value(std::string_view canonical, Names aliases, bool* from_defaults);
  // Whether the config, the fallback or the defaults name `key`, even as null.
  bool Mentions(std::string_view key) const;
  // Only the config and its fallback, no defaults.
  const json* Raw(std::string_view key) const;
  void NoteDefault(std::string_view canonical);

 private:
  struct Found {
    const json* value = nullptr;  // null when absent, or null where found
    bool from_defaults = false;
  };

  Found Resolve(std::string_view canonical, Names aliases) const;

  Scope scope_;
  std::vector<std::string>* defaulted_;
};

}  // namespace coverage::selection::detail

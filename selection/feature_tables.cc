#include "selection/feature_tables.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "core/json_capped.h"

namespace coverage::selection::detail {
namespace {

// Ordered, so that pair tables keep the file's order.
using ojson = nlohmann::ordered_json;

// How a table's entries are written and where they go. Exactly one of `set`
// and `pairs` is set.
struct TableSpec {
  const char* name;
  const char* entries;  // the member that holds the entries
  FamilySet FeatureTables::*set = nullptr;
  FamilyPairs FeatureTables::*pairs = nullptr;
  // Whether a pair table's keys are model types. Model types and activation
  // names are lowercase (the extractor compares them with lowercased or
  // canonical names, so an uppercase one could never match); architecture
  // prefixes are class names.
  bool lowercase_keys = true;
};

const TableSpec kSpecs[] = {
    {"legacy_model_types", "model_types", nullptr, &FeatureTables::legacy_model_types},
    {"legacy_architecture_prefixes", "prefixes", nullptr, &FeatureTables::legacy_architecture_prefixes, false},
    {"rms_norm", "families", &FeatureTables::rms_norm},
    {"layer_norm", "families", &FeatureTables::layer_norm},
    {"post_norm", "families", &FeatureTables::post_norm},
    {"pre_norm_encoders", "families", &FeatureTables::pre_norm_encoders},
    {"decoders", "families", &FeatureTables::decoders},
    {"encoders", "families", &FeatureTables::encoders},
    {"alibi", "families", &FeatureTables::alibi},
    {"sinusoidal", "families", &FeatureTables::sinusoidal},
    {"fixed_activations", "activations", nullptr, &FeatureTables::fixed_activations},
    {"gated_mlp", "families", &FeatureTables::gated_mlp},
    {"four_times_hidden", "families", &FeatureTables::four_times_hidden},
    {"hybrid", "families", &FeatureTables::hybrid},
    {"ssm", "families", &FeatureTables::ssm},
    {"speech", "families", &FeatureTables::speech},
    {"mrope", "families", &FeatureTables::mrope},
};

bool IsTableName(const std::string& name) {
  return std::any_of(std::begin(kSpecs), std::end(kSpecs), [&](const TableSpec& s) { return name == s.name; });
}

Status Bad(const std::string& where, const std::string& what) {
  return Status::InvalidArgument("feature tables: " + where + ": " + what);
}

bool IsLower(const std::string& s) {
  return std::none_of(s.begin(), s.end(), [](char c) { return std::isupper(static_cast<unsigned char>(c)); });
}

bool NonEmptyString(const ojson* v) {
  return v != nullptr && v->is_string() && !v->get_ref<const std::string&>().empty();
}

const ojson* Find(const ojson& object, const std::string& key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

// A model type or an activation name: non-empty, lowercase.
Status CheckName(const std::string& where, const ojson& v) {
  if (!NonEmptyString(&v)) return Bad(where, "expected a non-empty string");
  if (!IsLower(v.get_ref<const std::string&>())) return Bad(where, "expected lowercase");
  return Status::Ok();
}

Status ParseSet(const std::string& where, const ojson& list, FamilySet* out) {
  if (!list.is_array()) return Bad(where, "expected a list of model types");
  for (size_t i = 0; i < list.size(); ++i) {
    COV_RETURN_IF_ERROR(CheckName(where + "[" + std::to_string(i) + "]", list[i]));
    if (!out->insert(list[i].get<std::string>()).second) {
      return Bad(where, "\"" + list[i].get<std::string>() + "\" is listed twice");
    }
  }
  return Status::Ok();
}

Status ParsePairs(const std::string& where, const ojson& map, bool lowercase_keys, FamilyPairs* out) {
  if (!map.is_object()) return Bad(where, "expected an object of names to names");
  for (const auto& [key, value] : map.items()) {
    const std::string at = where + "." + key;
    if (key.empty()) return Bad(where, "a key is empty");
    if (lowercase_keys && !IsLower(key)) return Bad(at, "expected lowercase");
    COV_RETURN_IF_ERROR(CheckName(at, value));
    out->emplace_back(key, value.get<std::string>());
  }
  return Status::Ok();
}

Status ParseTable(const TableSpec& spec, const ojson& table, FeatureTables* out) {
  const std::string name = spec.name;
  if (!table.is_object()) return Bad(name, "expected an object");
  for (const auto& [key, value] : table.items()) {
    if (key != "comment" && key != spec.entries) {
      return Bad(name, "unknown member \"" + key + "\" (expected \"comment\" and \"" + spec.entries + "\")");
    }
  }
  if (!NonEmptyString(Find(table, "comment"))) {
    return Bad(name + ".comment", "expected a non-empty string saying what the table means");
  }
  const ojson* entries = Find(table, spec.entries);
  if (entries == nullptr) return Bad(name, std::string("missing \"") + spec.entries + "\"");
  const std::string where = name + "." + spec.entries;
  if (spec.set != nullptr) return ParseSet(where, *entries, &(out->*spec.set));
  return ParsePairs(where, *entries, spec.lowercase_keys, &(out->*spec.pairs));
}

}  // namespace

Result<FeatureTables> ParseFeatureTables(std::string_view text) {
  ojson root;
  try {
    root = ojson::parse(text.begin(), text.end());
  } catch (const ojson::exception& e) {
    return Status::InvalidArgument("feature tables: not valid JSON: " + JsonErrorText(e));
  }
  if (!root.is_object()) return Bad("top level", "expected an object");
  if (!NonEmptyString(Find(root, "comment"))) return Bad("comment", "expected a non-empty string");
  for (const auto& [key, value] : root.items()) {
    if (key != "comment" && !IsTableName(key)) return Bad(key, "not a known table");
  }
  FeatureTables tables;
  for (const TableSpec& spec : kSpecs) {
    const ojson* table = Find(root, spec.name);
    if (table == nullptr) return Bad(spec.name, "missing table");
    COV_RETURN_IF_ERROR(ParseTable(spec, *table, &tables));
  }
  return tables;
}

const FeatureTables& Tables() {
  static const FeatureTables tables = [] {
    auto parsed = ParseFeatureTables(kFeatureTablesJson);
    COV_CHECK(parsed.has_value(), parsed ? "" : parsed.error().ToString().c_str());
    return std::move(*parsed);
  }();
  return tables;
}

}  // namespace coverage::selection::detail

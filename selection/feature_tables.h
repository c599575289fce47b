// Family knowledge that config.json does not state (which families use
// RMSNorm under a `layer_norm_epsilon` name, which have gated MLPs, which
// encoders normalise after the residual), as data: selection/feature_tables.json,
// compiled into the library (selection/CMakeLists.txt embeds its text), so
// nothing is read from disk at run time. Each table's meaning is the
// "comment" beside it in the file. Internal to selection/.
//
// Thread safety: Tables() parses once (a function-local static) and the
// result is immutable; any thread may read it.
#pragma once

#include <functional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace coverage::selection::detail {

// model_type names; heterogeneous lookup by string_view.
using FamilySet = std::set<std::string, std::less<>>;
// Ordered pairs: file order, which is the order the code tries them in.
using FamilyPairs = std::vector<std::pair<std::string, std::string>>;

// One member per table of feature_tables.json, named as the table.
struct FeatureTables {
  FamilyPairs legacy_model_types;            // lowercase legacy model_type -> family
  FamilyPairs legacy_architecture_prefixes;  // class prefix ("RW") -> family
  FamilySet rms_norm;
  FamilySet layer_norm;
  FamilySet post_norm;
  FamilySet pre_norm_encoders;
  FamilySet decoders;
  FamilySet encoders;
  FamilySet alibi;
  FamilySet sinusoidal;
  FamilyPairs fixed_activations;  // family -> activation name
  FamilySet gated_mlp;
  FamilySet four_times_hidden;
  FamilySet hybrid;
  FamilySet ssm;
  FamilySet speech;
  FamilySet mrope;
};

// The text of feature_tables.json as it was at build time (defined in the
// generated kFeatureTablesJson.cc, cmake/embed_file.cmake).
extern const std::string_view kFeatureTablesJson;

// Parses tables in the form of feature_tables.json: an object with a string
// "comment" and one member per table, each an object with a non-empty
// "comment" and its entries (a list of distinct non-empty names, or an object
// of names to names). Every table must be present and no other member may be.
// Errors: InvalidArgument naming the table and entry ("rms_norm.families[3]:
// expected a non-empty string").
Result<FeatureTables> ParseFeatureTables(std::string_view text);

// The embedded tables, parsed on first use. Broken embedded tables are a bug
// in the build, not bad input: they abort with ParseFeatureTables' reason
// (a test parses them, so a broken edit fails there first).
const FeatureTables& Tables();

// Whether `family` is in `table` ("" never is).
inline bool InTable(std::string_view family, const FamilySet& table) {
  return !family.empty() && table.find(family) != table.end();
}

}  // namespace coverage::selection::detail

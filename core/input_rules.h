// Per-op input rules (Note [Value domains] in replay/materialize.cc), as
// data: the "inputs" of each op in configs/tolerances.json, compiled into the
// library (core/CMakeLists.txt embeds the file) and parsed once, so a case's
// inputs are the same in every run and on every machine. Two kinds:
//  * index: an integer argument that indexes a dimension (embedding's
//    indices, gather's index, index's indices, nll_loss's target, ...) takes
//    that whole dimension as its range, so a replay reads every row a model
//    could;
//  * values: an argument whose values need a structure (offsets, lengths,
//    distinct indices, a positive definite matrix) gets it.
// The unit stage's inputs, program replay's leaves and the repro script
// apply the same rules. configs/README.md describes the form. Torch-free.
//
// Thread safety: the rules are parsed on first use (a function-local static)
// and immutable after; any thread may apply them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/op_case.h"
#include "core/result.h"

namespace coverage {

// Gives every index argument of `c` with an integer domain the range of the
// dimension it indexes: [0, size), or [-size, size) where negative indices
// are allowed (aten::index) and the recorded range had some.
void IndexRules(OpCase& c);

// For each tensor argument of `op_case` in flattening order (a tensor, then
// each item of a tensor list: the order of ProgramCall::inputs), the size of
// the dimension it indexes under IndexRules, or 0 where it indexes none.
// Program replay gives an integer leaf with no recorded range the range of
// its uses as an index.
std::vector<int64_t> IndexedSizes(const OpCase& op_case);

// The structure one argument's values must have (the first "values" rule of
// the op whose argument and total apply), kind kNone when none does:
//  offsets: sorted, inside [0, total] along the last dimension, the first 0
//    (first_zero) and the last `total` (last_total) where the op needs it;
//  lengths: >= 0 and summing to `total` along the last dimension;
//  distinct indices: distinct inside each plane of `plane_dims` trailing
//    dimensions, in [0, total);
//  positive definite: a square matrix made A Aᴴ + n I.
struct StructuredValues {
  enum class Kind { kNone, kOffsets, kLengths, kDistinctIndices, kPositiveDefinite } kind = Kind::kNone;
  std::string arg;
  int64_t total = 0;
  bool first_zero = false;
  bool last_total = false;
  int64_t plane_dims = 0;

  // Joins the input cache key: the same spec under another rule is another tensor.
  std::string KeySuffix() const;
};
StructuredValues StructuredValuesOf(const OpCase& c);

// The "inputs" member of `op`'s entry in the built-in configs/tolerances.json
// (null when it has none): a tolerances file given at run time may repeat
// them but not change them (replay/compare_options.cc checks).
const nlohmann::json& BuiltInInputRules(std::string_view op);

// Checks the per-op input rules of a tolerances file's text (its
// ops.<op>.inputs members) as the library reads the built-in file: errors
// name the source, the op and the member.
Status CheckInputRules(std::string_view text, std::string_view source);

}  // namespace coverage

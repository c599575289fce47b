// CaseFilter: the filters of `coverage registry query|export|stats` and of
// stage planning, compiled to one parameterised SQL query over op_cases.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace coverage::registry {

// A predicate on the dimensions of tensor arguments, written
//   ARG[IDX] OP N     e.g. "self[-1]>=4096", "*[0]==1"
//   ARG.rank OP N     e.g. "input.rank==4"
// ARG is a schema argument name or "*" for any tensor argument (items of
// tensor lists are not matched); IDX may be
// negative (counted from the last dimension); OP is one of == != < <= > >=.
struct DimPredicate {
  std::string arg;                 // "*" matches any tensor argument
  std::optional<int64_t> index;    // dimension index; nullopt means rank
  std::string op;                  // SQL comparison operator
  int64_t value = 0;
  std::string text;                // as the user wrote it
};

Result<DimPredicate> ParseDimPredicate(std::string_view text);

struct CaseFilter {
  std::vector<std::string> ops;  // "aten::mm", "mm" or "add.Tensor"; any of them
  std::string model;             // source model id; '*' and '?' are wildcards
  std::string dtype;             // a tensor argument has this dtype ("bf16")
  std::vector<DimPredicate> dims;  // all must hold
  std::optional<double> min_flops;
  std::optional<double> max_flops;
  std::string profile;           // a source with this input profile
  std::vector<std::string> keys; // case keys; any of them
  std::string source;           // "": any; "captured": from a model; "opinfo": from an OpInfo sample
  int64_t limit = 0;             // 0 = no limit
};

// Normalises an op filter: "mm" -> "aten::mm".
std::string NormaliseOpName(std::string_view op);

}  // namespace coverage::registry

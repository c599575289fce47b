// ComparisonOptions: how a backend's outputs are judged against the CPU
// reference and the fp64 golden. Torch-free, so the app can fill it from
// configs/tolerances.json. See Note [Tolerances] in compare.cc.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/op_case.h"
#include "core/result.h"
#include "replay/numerics.h"

namespace coverage::replay {

struct Tolerance {
  double rtol = 0;
  double atol = 0;
};

// Outputs whose values say nothing about a backend (uninitialised memory,
// random draws): only their shape and dtype are compared.
struct ValuesNotCompared {
  bool all = false;             // every output of every call
  std::vector<size_t> outputs;  // these outputs (flattened index)
  std::string when;             // only when this bool argument is true ("train")
};

// One op's rules (configs/tolerances.json "ops"): its tolerances and which
// of its outputs are compared by value.
struct OpToleranceOverride {
  std::map<DType, Tolerance> tolerances;  // replaces the default for these dtypes
  std::map<DType, double> multipliers;    // replaces the default for these dtypes
  std::optional<ValuesNotCompared> values_not_compared;
};

struct ComparisonOptions {
  // Defaults are torch.testing.assert_close's: fp32 1.3e-6/1e-5, bf16
  // 1.6e-2/1e-5, fp16 1e-3/1e-5, fp64 1e-7/1e-7; integers and bool exact.
  std::map<DType, Tolerance> tolerances = {
      {DType::kFloat32, {1.3e-6, 1e-5}}, {DType::kBFloat16, {1.6e-2, 1e-5}},
      {DType::kFloat16, {1e-3, 1e-5}},   {DType::kFloat64, {1e-7, 1e-7}},
      {DType::kComplex64, {1.3e-6, 1e-5}}, {DType::kComplex128, {1e-7, 1e-7}},
  };
  double default_multiplier = 2.0;  // backend error may be this many times the CPU's own
  std::map<DType, double> multipliers = {{DType::kBFloat16, 3.0}, {DType::kFloat16, 3.0}};
  std::map<std::string, OpToleranceOverride> per_op;  // key: "aten::op" or "aten::op.overload"
  // How the backend says it computes (Note [Declared numerics]): the
  // reference of a declared op computes the same way. Set by the app from
  // --numerics, not read from the tolerances file.
  DeclaredNumerics numerics;

  // Tolerance for an output of `dtype` produced by `qualified_op`; exact
  // (0, 0) for dtypes without an entry (integers, bool).
  Tolerance For(std::string_view op, std::string_view overload, DType dtype) const;
  double MultiplierFor(std::string_view op, std::string_view overload, DType dtype) const;
  // False when output `output` (an index into the call's flattened outputs)
  // of `op_case` holds uninitialised or random values by the op's rules
  // (aten::empty, rand, normal_, dropout in training, _ctc_loss's
  // log_alpha, ...): only its shape and dtype are compared.
  bool ValuesCompared(const OpCase& op_case, size_t output) const;

  // Parses the JSON of configs/tolerances.json (see configs/README.md),
  // starting from the defaults above. Errors name the offending key.
  static Result<ComparisonOptions> FromJson(std::string_view json, std::string_view source_name);
};

}  // namespace coverage::replay

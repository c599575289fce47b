// Fuzz target: the op-case JSON parser (OpCase::FromJson, core/op_case.h),
// which reads every case the registry stores and every unit request a
// worker gets. Invariants: bad input is a Corruption, never an exception;
// a parsed case serialises to canonical JSON that parses back to the same
// case, key and bytes (canonical form is a fixed point); what the stages do
// with a case (summary, dtypes, cost, tensor sizes) runs on anything parsed.
#include <cmath>

#include "core/cost.h"
#include "core/op_case.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace coverage;

bool HasNaN(const OpCase& c) {
  for (const auto& a : c.args) {
    if (a.kind == Argument::Kind::kDouble && std::isnan(a.d)) return true;
    for (double d : a.doubles) {
      if (std::isnan(d)) return true;
    }
  }
  return false;
}

void CheckTensor(const TensorSpec& t) {
  FUZZ_CHECK(t.shape.size() == t.strides.size(), t.ToJson());
  auto again = TensorSpec::FromJson(t.ToJson());
  FUZZ_CHECK(again.has_value(), again.error().ToString());
  FUZZ_CHECK(*again == t, t.ToJson());
  FUZZ_CHECK(t.Numel() >= 0, t.ToJson());
  FUZZ_CHECK(t.StorageNumel() >= 0, t.ToJson());
  (void)t.IsContiguous();
  (void)t.ToShortString();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parsed = OpCase::FromJson(fuzz::AsText(data, size));
  if (!parsed) {
    FUZZ_CHECK(parsed.error().code() == StatusCode::kCorruption, parsed.error().ToString());
    return 0;
  }
  const OpCase& c = *parsed;
  const std::string canonical = c.ToCanonicalJson();
  auto again = OpCase::FromJson(canonical);
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + canonical);
  FUZZ_CHECK(again->ToCanonicalJson() == canonical, canonical);
  FUZZ_CHECK(again->Key() == c.Key(), canonical);
  if (!HasNaN(c)) FUZZ_CHECK(*again == c, canonical);  // NaN != NaN; the bytes above already agree

  for (const auto& a : c.args) {
    if (a.kind == Argument::Kind::kTensor) CheckTensor(a.tensor);
    for (const auto& t : a.tensors) {
      if (t) CheckTensor(*t);
    }
  }
  (void)c.Summary();
  const auto dtypes = c.DTypes();
  for (size_t i = 1; i < dtypes.size(); ++i) {
    FUZZ_CHECK(DTypeName(dtypes[i - 1]) < DTypeName(dtypes[i]), "DTypes() not sorted and unique: " + canonical);
  }
  const CostEstimate cost = EstimateCost(c, {});
  FUZZ_CHECK(!(cost.flops < 0) && !(cost.bytes < 0), canonical);
  (void)EstimateReplayBytes(c, cost.bytes);
  return 0;
}

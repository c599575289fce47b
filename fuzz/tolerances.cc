// Fuzz target: tolerance files (configs/tolerances.json,
// replay/compare_options.h). Invariants: bad input is InvalidArgument;
// accepted tolerances and multipliers are >= 0 and the default multiplier
// >= 1; written back as a tolerances file, the options parse to the same
// tolerance and multiplier for every dtype and op.
#include "core/op_case.h"
#include "fuzz/fuzz_check.h"
#include "replay/compare_options.h"

namespace {

using namespace coverage;
using namespace coverage::replay;

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16,   DType::kBFloat16,
                             DType::kInt8,    DType::kUInt8,   DType::kInt16,     DType::kInt32,
                             DType::kInt64,   DType::kBool,    DType::kComplex64, DType::kComplex128};

nlohmann::json DTypeTable(const std::map<DType, Tolerance>& tol, const std::map<DType, double>& mult) {
  nlohmann::json t = nlohmann::json::object();
  for (const auto& [d, v] : tol) t[std::string(DTypeName(d))] = {{"rtol", v.rtol}, {"atol", v.atol}};
  for (const auto& [d, m] : mult) t[std::string(DTypeName(d))]["multiplier"] = m;
  return t;
}

nlohmann::json ToJson(const ComparisonOptions& o) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, ov] : o.per_op) ops[op] = {{"dtypes", DTypeTable(ov.tolerances, ov.multipliers)}};
  return {{"default_multiplier", o.default_multiplier},
          {"dtypes", DTypeTable(o.tolerances, o.multipliers)},
          {"ops", ops}};
}

void CheckSame(const ComparisonOptions& a, const ComparisonOptions& b, const std::string& op, const std::string& text) {
  for (DType d : kDTypes) {
    const Tolerance ta = a.For(op, "", d), tb = b.For(op, "", d);
    FUZZ_CHECK(ta.rtol == tb.rtol && ta.atol == tb.atol, op + " " + std::string(DTypeName(d)) + " in " + text);
    FUZZ_CHECK(a.MultiplierFor(op, "", d) == b.MultiplierFor(op, "", d), op + " in " + text);
    FUZZ_CHECK(ta.rtol >= 0 && ta.atol >= 0 && a.MultiplierFor(op, "", d) >= 0, text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto o = ComparisonOptions::FromJson(fuzz::AsText(data, size), "fuzz.json");
  if (!o) {
    FUZZ_CHECK(o.error().code() == StatusCode::kInvalidArgument, o.error().ToString());
    return 0;
  }
  FUZZ_CHECK(o->default_multiplier >= 1, std::to_string(o->default_multiplier));
  const std::string text = fuzz::Dump(ToJson(*o));
  auto again = ComparisonOptions::FromJson(text, "again.json");
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + text);
  CheckSame(*o, *again, "aten::unlisted", text);
  for (const auto& [op, unused] : o->per_op) {
    CheckSame(*o, *again, op, text);
    const size_t dot = op.find('.', op.find("::"));
    if (dot != std::string::npos) {
      // "aten::add.Tensor" is also found as ("aten::add", "Tensor").
      const Tolerance t = o->For(op.substr(0, dot), op.substr(dot + 1), DType::kFloat32);
      FUZZ_CHECK(t.rtol == o->For(op, "", DType::kFloat32).rtol, op);
    }
  }
  return 0;
}

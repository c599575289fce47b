// Fuzz target: the captured-program format, the capture tracer's JSON lines
// (capture/trace_reader.h). The input is a tracer's stdout, fed line by line
// as the capture driver does until a line is refused, then finished.
// Invariants: bad output is an error value (Corruption, or Unsupported for
// another tracer version); a finished program has its calls in index order,
// one input id per tensor argument, op cases that round-trip through the
// canonical JSON with the same key, and a finite, non-negative footprint.
#include <cmath>

#include "capture/trace_reader.h"
#include "core/program.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace coverage;

bool InputError(const Status& s) {
  return s.code() == StatusCode::kCorruption || s.code() == StatusCode::kUnsupported;
}

void CheckCall(const ProgramCall& call, size_t position) {
  FUZZ_CHECK(call.index == static_cast<int64_t>(position), call.op);
  if (!call.op_case) {
    FUZZ_CHECK(call.inputs.empty(), call.op);
    return;
  }
  size_t tensors = 0;
  for (const auto& a : call.op_case->args) {
    if (a.kind == Argument::Kind::kTensor) ++tensors;
    if (a.kind == Argument::Kind::kTensorList) tensors += a.tensors.size();
  }
  FUZZ_CHECK(call.inputs.size() == tensors, call.op);
  const std::string canonical = call.op_case->ToCanonicalJson();
  auto again = OpCase::FromJson(canonical);
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + canonical);
  FUZZ_CHECK(again->ToCanonicalJson() == canonical && again->Key() == call.op_case->Key(), canonical);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text = fuzz::AsText(data, size);
  capture::TraceReader reader;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (Status s = reader.Feed(line); !s.ok()) {
      FUZZ_CHECK(InputError(s), s.ToString());
      return 0;
    }
  }
  auto outcome = reader.Finish();
  if (!outcome) {
    FUZZ_CHECK(InputError(outcome.error()), outcome.error().ToString());
    return 0;
  }
  FUZZ_CHECK(outcome->program.has_value() != outcome->error.has_value(), "a program and an error, or neither");
  if (!outcome->program) return 0;
  const Program& p = *outcome->program;
  for (size_t i = 0; i < p.calls.size(); ++i) CheckCall(p.calls[i], i);
  const ProgramFootprint f = EstimateFootprint(p);
  FUZZ_CHECK(std::isfinite(f.leaf_bytes) && f.leaf_bytes >= 0 && !(f.flops < 0),
             p.info.model_id);
  return 0;
}

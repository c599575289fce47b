// Fuzz target: the worker protocol (isolation/protocol.h). One input is one
// line, read as each side would read it: as a request by the worker
// (setup, unit, model) and as each kind of reply by the parent (ready,
// a case result, model items). Invariants: nothing throws; a parsed setup,
// case result or model item writes JSON that parses back to the same JSON.
#include "core/case_result.h"
#include "core/op_case.h"
#include "fuzz/fuzz_check.h"
#include "isolation/isolation.h"
#include "isolation/protocol.h"

namespace {

using namespace coverage;
using namespace coverage::isolation;

void CheckSetup(const nlohmann::json& body) {
  auto setup = WorkerSetup::FromJson(body);
  if (!setup) {
    FUZZ_CHECK(fuzz::IsInputError(setup.error()), setup.error().ToString());
    return;
  }
  const std::string text = fuzz::Dump(setup->ToJson());
  auto again = WorkerSetup::FromJson(setup->ToJson());
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + text);
  FUZZ_CHECK(fuzz::Dump(again->ToJson()) == text, text);
  const ReplayOptions replay = setup->Replay();
  FUZZ_CHECK(replay.warm_iterations == setup->warm_iterations && replay.seed == setup->seed, text);
  // A declaration read once reads the same the second time.
  FUZZ_CHECK(again->checks.comparison.numerics.text == setup->checks.comparison.numerics.text, text);
}

void CheckCaseResult(const CaseResult& r) {
  const std::string text = r.ToJson();
  auto again = CaseResult::FromJson(text);
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + text);
  FUZZ_CHECK(again->ToJson() == text, text);
}

void CheckModelItems(const std::vector<ModelItemResult>& items) {
  for (const auto& item : items) {
    const nlohmann::json j = item.ToJsonValue();
    auto again = ModelItemResult::FromJsonValue(j);
    FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + fuzz::Dump(j));
    FUZZ_CHECK(fuzz::Dump(again->ToJsonValue()) == fuzz::Dump(j), fuzz::Dump(j));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line = fuzz::AsText(data, size);

  // The worker's side.
  if (auto request = ParseWorkerRequest(line); request) {
    if (request->kind == "setup") {
      CheckSetup(request->body);
    } else if (request->kind == "unit") {
      auto c = OpCase::FromJsonValue(request->body);
      FUZZ_CHECK(c.has_value() || fuzz::IsInputError(c.error()), c.error().ToString());
    }
  } else {
    FUZZ_CHECK(fuzz::IsInputError(request.error()), request.error().ToString());
  }

  // The parent's side.
  if (auto ready = ParseSetupReply(line); !ready) {
    FUZZ_CHECK(ready.error().code() == StatusCode::kInvalidArgument, ready.error().ToString());
  }
  if (auto result = ParseUnitReply(line); result) {
    CheckCaseResult(*result);
  } else {
    FUZZ_CHECK(result.error().code() == StatusCode::kCorruption || result.error().code() == StatusCode::kInternal,
               result.error().ToString());
  }
  if (auto items = ParseModelReply(line); items) {
    CheckModelItems(*items);
  }
  return 0;
}

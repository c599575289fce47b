// Fuzz target: expectations files (configs/expectations/<backend>.json,
// reports/expectations.h). Invariants: bad input is InvalidArgument; every
// accepted entry has a reason, a known stage and dtype, and selects one kind
// of result; written back it parses to the same entries; an entry matches
// the case or model item made from its own fields (or an earlier entry does).
#include "core/op_case.h"
#include "fuzz/fuzz_check.h"
#include "reports/expectations.h"

namespace {

using namespace coverage;
using namespace coverage::reports;

nlohmann::json ToJson(const Expectations& x) {
  nlohmann::json entries = nlohmann::json::array();
  for (const Expectation& e : x.entries) {
    nlohmann::json j = {{"reason", e.reason}};
    for (const auto& [key, value] : {std::pair{"stage", &e.stage}, {"op", &e.op}, {"key", &e.key},
                                     {"dtype", &e.dtype}, {"model", &e.model}, {"item", &e.item}}) {
      if (!value->empty()) j[key] = *value;
    }
    if (!e.outcomes.empty()) {
      j["outcomes"] = nlohmann::json::array();
      for (Outcome o : e.outcomes) j["outcomes"].push_back(OutcomeName(o));
    }
    entries.push_back(std::move(j));
  }
  return {{"backend", x.backend}, {"expected_failures", entries}};
}

bool HasGlob(const std::string& s) { return s.find_first_of("*?[\\") != std::string::npos; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto x = Expectations::FromJson(fuzz::AsText(data, size), "fuzz.json");
  if (!x) {
    FUZZ_CHECK(x.error().code() == StatusCode::kInvalidArgument, x.error().ToString());
    return 0;
  }
  const std::string text = fuzz::Dump(ToJson(*x));
  auto again = Expectations::FromJson(text, "again.json");
  FUZZ_CHECK(again.has_value(), again.error().ToString());
  FUZZ_CHECK(fuzz::Dump(ToJson(*again)) == text, text);

  for (const Expectation& e : x->entries) {
    FUZZ_CHECK(!e.reason.empty(), text);
    FUZZ_CHECK(e.stage.empty() || e.stage == "unit" || e.stage == "module" || e.stage == "model" || e.stage == "train",
               e.stage);
    FUZZ_CHECK(e.dtype.empty() || DTypeFromName(e.dtype), e.dtype);
    const bool unit = !e.op.empty() || !e.key.empty() || !e.dtype.empty();
    const bool model = !e.model.empty() || !e.item.empty();
    FUZZ_CHECK(!(unit && model), text);
    const std::optional<Outcome> outcome =
        e.outcomes.empty() ? std::nullopt : std::optional<Outcome>(e.outcomes.front());
    if (e.stage.empty() || e.stage == "unit") {
      if (!model) {
        const std::vector<std::string> dtypes = e.dtype.empty() ? std::vector<std::string>{} : std::vector{e.dtype};
        FUZZ_CHECK(x->MatchCase(e.op, e.key, dtypes, outcome) != nullptr, text);
      }
    }
    if (e.stage != "unit" && !unit && !HasGlob(e.model)) {
      const std::string stage = e.stage.empty() ? "model" : e.stage;
      FUZZ_CHECK(x->MatchModelItem(stage, e.model.empty() ? "org/any" : e.model, e.item, outcome) != nullptr, text);
    }
  }
  return 0;
}

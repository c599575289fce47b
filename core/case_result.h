// CaseResult: everything one execution of a case produced. It is a plain
// record with a JSON form so that the loop that runs cases can move into a
// worker process and send results over a pipe without changing what is
// stored (see stages/unit_stage.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/outcome.h"
#include "core/result.h"

namespace coverage {

// Where the time of one case went, in microseconds. "Compute" is time inside
// dispatcher calls (golden, reference and backend); everything else is
// harness overhead.
// Where a case's time went; a case rerun in worker processes (Note [Reruns])
// has its attempts' times summed.
struct CaseTiming {
  double materialize_us = 0;  // making inputs (CPU) and copying them to the device
  double golden_us = 0;       // the fp64 golden run, when there is one
  double reference_us = 0;    // the CPU reference run
  double backend_us = 0;      // all backend runs: first call + warm repetitions
  double compare_us = 0;      // comparing outputs
  double total_us = 0;        // the whole case, start to end

  double ComputeUs() const { return golden_us + reference_us + backend_us; }
};

struct CaseResult {
  Outcome outcome = Outcome::kPass;
  std::string error;  // error text, skip reason, or first mismatch description
  // Metrics over all tensor outputs; see Note [Tolerances] in replay/compare.cc.
  std::optional<double> max_abs_err;    // max |backend - reference|
  std::optional<double> max_rel_err;    // max |backend - reference| / |reference|
  std::optional<double> mismatch_frac;  // share of elements outside tolerance
  std::optional<double> cosine;         // lowest cosine similarity of any output
  std::optional<double> error_ratio;    // backend error / CPU error, both vs the fp64 golden
  std::optional<double> first_call_us;  // first backend call
  std::optional<double> warm_us;        // median of the warm backend calls
  std::optional<double> warm_spread_us; // slowest minus fastest warm backend call (needs 2 or more)
  std::optional<double> warm_min_us;    // fastest warm backend call (Note [Fastest calls] in reports/build.cc)
  // How much each of the backend's cumulative counters (Backend::Counters:
  // compiles, cache_hits, fallbacks, allocations, ...) grew while this case
  // ran on the backend, inputs placed on the device included. Counters that
  // did not change are left out.
  std::map<std::string, int64_t> counters;
  CaseTiming timing;
  std::string detail_json;  // per-output details; free-form JSON object
  // Reruns (isolation/isolation.h): the outcome above is the first attempt's.
  int attempts = 1;
  bool flaky = false;                    // the attempts' outcomes disagree
  std::vector<Outcome> attempt_outcomes;  // one per attempt when rerun; empty for one attempt

  std::string ToJson() const;
  static Result<CaseResult> FromJson(std::string_view json);
  // The text forms a row and a report hold: counters as a compact JSON
  // object, attempt outcomes as "crash,pass"; "" when there are none. The
  // setters read them back; an error names what is wrong.
  std::string CountersText() const;
  std::string AttemptOutcomesText() const;
  Status SetCountersText(std::string_view text);
  Status SetAttemptOutcomesText(std::string_view text);
  // The same form as a JSON value (the worker's reply carries it inside an
  // object); the detail is a JSON value in it, not text.
  nlohmann::json ToJsonValue() const;
  static Result<CaseResult> FromJsonValue(const nlohmann::json& j);
};

}  // namespace coverage

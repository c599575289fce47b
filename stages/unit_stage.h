// The unit stage: every planned op case runs on the backend under test and on
// the CPU reference; each result is written to the registry as soon as it is
// known, so an interrupted run loses at most the case in flight.
//
// Each case is marked in flight before it is sent to the executor, and the
// mark is cleared with its result in one transaction (Registry::MarkInFlight),
// so a run killed at any moment (SIGKILL included) resumes with nothing lost
// and nothing twice.
//
// Resuming: running again with the same run id skips the cases that already
// have a final result in that run (no rerun, no duplicate rows); cases
// recorded as skipped are retried, since a cost cap or the data may have
// changed. Resuming with other replay options is refused.
//
// The loop talks to a replay::CaseExecutor and stores CaseResults, which
// have a JSON form: moving execution into worker processes later changes the
// executor, not the stage or the result format.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "core/outcome.h"
#include "core/result.h"
#include "registry/case_query.h"
#include "stages/stage_run.h"

namespace coverage::registry {
class Registry;
}
namespace coverage::replay {
class CaseExecutor;
}

namespace coverage::stages {

// The run itself (id, backend, config_json, shard, stop) is StageRunOptions';
// config_json's "replay" member (what changes results) must match on resume.
struct UnitStageOptions : StageRunOptions {
  registry::CaseFilter filter;          // which cases to plan
  std::optional<double> max_case_flops; // costlier cases are recorded as skipped
  std::optional<double> max_case_bytes; // cases whose replay would hold more (EstimateReplayBytes) likewise
};

struct OpOutcomeCounts {
  std::map<Outcome, int64_t> counts;
  int64_t Total() const;
};

struct UnitStageSummary {
  std::string run_id;
  bool resumed = false;
  bool interrupted = false;
  int64_t planned = 0;        // cases matching the filter
  int64_t already_done = 0;   // had results before this invocation (resume)
  int64_t executed = 0;       // run now
  int64_t skipped_by_cost = 0;
  int64_t outside_shard = 0;  // cases matching the filter that other shards run
  int64_t was_in_flight = 0;  // sent to a worker by an earlier invocation that stopped before their result
  int64_t flaky = 0;          // whole run: cases whose attempts disagreed
  int64_t rerun = 0;          // whole run: cases run more than once
  double seconds = 0;
  double compute_seconds = 0;  // time inside dispatcher calls (see CaseTiming)
  std::map<std::string, OpOutcomeCounts> per_op;  // whole run, including earlier invocations
  OpOutcomeCounts totals;
  bool Failed() const;        // any unexpected failure in the run
};

// Plans cases from `registry`, runs the ones without a result in the run, and
// summarises the whole run. Statuses are harness failures (database, a filter
// that matches nothing, run id reused for another stage); backend failures
// are outcomes.
Result<UnitStageSummary> RunUnitStage(registry::Registry& registry, replay::CaseExecutor& executor,
                                      const UnitStageOptions& options);

}  // namespace coverage::stages

#include "stages/unit_stage.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cost.h"
#include "core/progress.h"
#include "registry/registry.h"
#include "replay/replay.h"

namespace coverage::stages {
namespace {

// Note [Case batches] (RunUnitStage).
constexpr size_t kBatchCases = 64;
constexpr double kBatchSeconds = 0.05;

// Why case `c` is over a cost cap of `options`, or empty when it is not.
std::string CostCapReason(const registry::StoredCase& c, const UnitStageOptions& options) {
  if (options.max_case_flops && c.cost.flops > *options.max_case_flops) {
    return fmt::format("estimated {:.3g} FLOPs exceeds --max-case-flops {:.3g}", c.cost.flops,
                       *options.max_case_flops);
  }
  if (!options.max_case_bytes) return "";
  const double bytes = EstimateReplayBytes(c.op_case, c.cost.bytes);
  if (bytes <= *options.max_case_bytes) return "";
  return fmt::format("needs about {:.3g} GB to replay (inputs and outputs on the reference and the backend, and the "
                     "fp64 golden), over --max-case-gb {:.3g}",
                     bytes / 1e9, *options.max_case_bytes / 1e9);
}

// Note [Case order]
// The cases run grouped by their largest input storage (Note [Storage keys]
// in core/op_case.cc): the cases that read one weight (`t` of it, `mm` with
// it, its optimizer steps, in prefill and decode) run one after the other
// while the replay's input cache still holds its storage, instead of spread
// over the run in key order, where each made it again. The largest come
// first: side by side on the main job's registry, the same groups in the
// order of a hash of their key spent 86.5 s making inputs against 55.1 s.
// As the first cases are then the slow ones, the progress line estimates
// the time left from the cases' costs (flops and bytes), not their count,
// which made it 20 times too long. The order changes no result: every
// input is seeded by its case.
struct LargestInput {
  double bytes = 0;  // double: a hostile spec's size times 8 may not fit int64
  std::string key;
};

LargestInput LargestInputOf(const OpCase& c) {
  LargestInput out;
  auto consider = [&](const TensorSpec& t) {
    if (!t.SizesFit()) return;
    const double bytes = static_cast<double>(t.StorageNumel()) * static_cast<double>(DTypeSize(t.dtype));
    if (bytes > out.bytes) out = {bytes, t.StorageKey()};
  };
  c.ForEachTensor(consider);
  return out;
}

void OrderForInputReuse(std::vector<const registry::StoredCase*>& todo) {
  std::vector<std::pair<LargestInput, const registry::StoredCase*>> keyed;
  keyed.reserve(todo.size());
  for (const auto* c : todo) keyed.emplace_back(LargestInputOf(c->op_case), c);
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return std::tie(b.first.bytes, a.first.key) < std::tie(a.first.bytes, b.first.key);
  });
  for (size_t i = 0; i < todo.size(); ++i) todo[i] = keyed[i].second;
}

}  // namespace

int64_t OpOutcomeCounts::Total() const {
  int64_t n = 0;
  for (const auto& [o, c] : counts) n += c;
  return n;
}

bool UnitStageSummary::Failed() const {
  for (const auto& [o, c] : totals.counts) {
    if (c > 0 && IsUnexpectedFailure(o)) return true;
  }
  return false;
}

Result<UnitStageSummary> RunUnitStage(registry::Registry& registry, replay::CaseExecutor& executor,
                                      const UnitStageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  UnitStageSummary summary;

  COV_ASSIGN_OR_RETURN(auto cases, registry.FindCases(options.filter));
  if (cases.empty()) {
    return Status::NotFound("no op cases in the registry match the filters; `coverage registry query` with the same "
                            "filters shows what there is");
  }

  COV_ASSIGN_OR_RETURN(StageRun run, StageRun::Open(registry, "unit", "unit", "replay", options));
  summary.run_id = run.id();
  summary.resumed = run.resumed();
  COV_ASSIGN_OR_RETURN(auto finished, registry.FinishedCaseIds(summary.run_id));
  std::erase_if(cases, [&](const registry::StoredCase& c) {
    const bool other = !run.Owns(c.key);
    summary.outside_shard += other;
    return other;
  });
  summary.planned = static_cast<int64_t>(cases.size());

  std::vector<const registry::StoredCase*> todo;
  for (const auto& c : cases) {
    // Marks of cases outside this invocation's filter or shard stay for the
    // invocation that runs them.
    summary.was_in_flight += run.WasInFlight("case:" + std::to_string(c.case_id));
    if (finished.count(c.case_id)) {
      ++summary.already_done;
    } else {
      todo.push_back(&c);
    }
  }

  OrderForInputReuse(todo);

  // Cases over a cost cap are skipped without running, with the reason.
  std::vector<std::string> over_cap(todo.size());
  for (size_t i = 0; i < todo.size(); ++i) over_cap[i] = CostCapReason(*todo[i], options);
  // A rough time per case for the progress line's estimate (Note [Case
  // order]): 10 GFLOP/s and 1 GB/s, and a millisecond a case.
  std::vector<double> work_before(todo.size() + 1, 0.0);
  for (size_t i = 0; i < todo.size(); ++i) {
    double work = 1e-3;
    if (over_cap[i].empty()) {
      const double flops = todo[i]->cost.flops, bytes = todo[i]->cost.bytes;
      if (std::isfinite(flops) && flops > 0) work += flops / 1e10;
      if (std::isfinite(bytes) && bytes > 0) work += bytes / 1e9;
    }
    work_before[i + 1] = work_before[i] + work;
  }
  Progress progress(fmt::format("unit {} on {}", summary.run_id, options.backend), static_cast<int64_t>(todo.size()),
                    options.progress);
  int64_t failures = 0;
  int64_t done = 0;
  auto record = [&](size_t i, const CaseResult& result) -> Status {
    if (IsUnexpectedFailure(result.outcome)) ++failures;
    COV_RETURN_IF_ERROR(registry.RecordResult(summary.run_id, todo[i]->case_id, result));
    ++done;
    progress.Update(done, fmt::format("{} failing | {}", failures, todo[i]->op_case.QualifiedName()),
                    work_before[i + 1] / work_before.back());
    return Status::Ok();
  };
  for (size_t i = 0; i < todo.size();) {
    if (run.StopRequested()) {
      summary.interrupted = true;
      break;
    }
    if (!over_cap[i].empty()) {
      CaseResult skipped;
      skipped.outcome = Outcome::kSkipped;
      skipped.error = std::move(over_cap[i]);
      ++summary.skipped_by_cost;
      COV_RETURN_IF_ERROR(record(i, skipped));
      ++i;
      continue;
    }
    // Note [Case batches]: small cases go together to an executor that
    // pipelines them (worker isolation, Note [Pipelined requests]), so a
    // worker goes from one to the next while their results are stored here.
    // A batch is at most kBatchCases cases of kBatchSeconds of estimated
    // work (one case when it alone is more), so a stop waits for little; its
    // cases are marked in flight together, and a case without a result when
    // the run ends stays marked for the resume. Other executors get one case
    // at a time.
    size_t end = i + 1;
    while (executor.Pipelines() && end < todo.size() && end - i < kBatchCases && over_cap[end].empty() &&
           work_before[end + 1] - work_before[i] <= kBatchSeconds) {
      ++end;
    }
    std::vector<const OpCase*> batch;
    for (size_t k = i; k < end; ++k) {
      COV_RETURN_IF_ERROR(run.Begin("case:" + std::to_string(todo[k]->case_id)));
      batch.push_back(&todo[k]->op_case);
    }
    Status stored;
    executor.RunMany(batch, [&](size_t k, CaseResult result) {
      if (!stored.ok()) return;
      ++summary.executed;
      summary.compute_seconds += result.timing.ComputeUs() / 1e6;
      stored = record(i + k, result);
    });
    COV_RETURN_IF_ERROR(stored);
    if (Status harness = executor.HarnessStatus(); !harness.ok()) {
      // Stopped while a worker started: the cases without a result stay in
      // flight and run again on resume.
      if (harness.code() == StatusCode::kAborted && run.StopRequested()) {
        summary.interrupted = true;
        break;
      }
      return harness;
    }
    i = end;
  }
  progress.Finish();

  // Summarise the whole run, including cases finished by earlier invocations.
  COV_ASSIGN_OR_RETURN(auto results, registry.ResultsForRun(summary.run_id));
  std::unordered_map<int64_t, const registry::StoredCase*> by_id;
  for (const auto& c : cases) by_id[c.case_id] = &c;
  for (const auto& r : results) {
    auto it = by_id.find(r.case_id);
    if (it == by_id.end()) continue;  // outside this invocation's filter
    ++summary.per_op[it->second->op_case.QualifiedName()].counts[r.result.outcome];
    ++summary.totals.counts[r.result.outcome];
    summary.flaky += r.result.flaky;
    summary.rerun += r.result.attempts > 1;
  }
  COV_RETURN_IF_ERROR(run.Finish(summary.interrupted));
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace coverage::stages

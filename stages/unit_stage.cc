#include "stages/unit_stage.h"

#include <unistd.h>

#include <chrono>
#include <cctype>
#include <ctime>
#include <set>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "registry/registry.h"
#include "runners/replay.h"

namespace coverage::stages {
namespace {

std::string FormatTime(const char* format) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

registry::ResultRecord ToRecord(const std::string& run_id, int64_t case_id, const CaseResult& r) {
  registry::ResultRecord rec;
  rec.run_id = run_id;
  rec.case_id = case_id;
  rec.outcome = r.outcome;
  rec.error = r.error;
  rec.max_abs_err = r.max_abs_err;
  rec.max_rel_err = r.max_rel_err;
  rec.mismatch_frac = r.mismatch_frac;
  rec.cosine = r.cosine;
  rec.error_ratio = r.error_ratio;
  rec.first_call_us = r.first_call_us;
  rec.warm_us = r.warm_us;
  rec.detail_json = fmt::format(R"({{"timing":{{"materialize_us":{:.1f},"golden_us":{:.1f},"reference_us":{:.1f},)"
                                R"("backend_us":{:.1f},"compare_us":{:.1f},"total_us":{:.1f}}},"replay":{}}})",
                                r.timing.materialize_us, r.timing.golden_us, r.timing.reference_us, r.timing.backend_us,
                                r.timing.compare_us, r.timing.total_us, r.detail_json.empty() ? "null" : r.detail_json);
  rec.warm_spread_us = r.warm_spread_us;
  if (!r.counters.empty()) rec.counters_json = nlohmann::json(r.counters).dump();
  rec.attempts = r.attempts;
  rec.flaky = r.flaky;
  for (Outcome o : r.attempt_outcomes) {
    rec.attempt_outcomes += (rec.attempt_outcomes.empty() ? "" : ",") + std::string(OutcomeName(o));
  }
  return rec;
}

// Results of one run must come from one way of judging them: resuming with
// other replay options (golden mode, seed, tolerances, ...) is refused.
Status CheckSameReplayConfig(const registry::RunRecord& stored, const UnitStageOptions& options) {
  auto replay_of = [](const std::string& text) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    return j.is_object() && j.contains("replay") ? j["replay"] : nlohmann::json();
  };
  const nlohmann::json before = replay_of(stored.config_json), now = replay_of(options.config_json);
  if (before == now) return Status::Ok();
  return Status::InvalidArgument("run '" + stored.run_id + "' was started with replay options " + before.dump() +
                                 "; resuming it with " + now.dump() +
                                 " would mix results judged differently (pass the same options or a new --run id)");
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

std::string NowIso8601() { return FormatTime("%Y-%m-%dT%H:%M:%SZ"); }

std::string NewRunId(const std::string& backend, const std::string& stage) {
  std::string safe;
  for (char c : backend) safe.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  // Milliseconds and the process id keep two runs started in one second apart.
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch()).count() % 1000;
  return FormatTime("%Y%m%dT%H%M%S") + fmt::format("{:03d}Z-{}-{}-{}", ms, safe, stage, getpid());
}

Result<UnitStageSummary> RunUnitStage(registry::Registry& registry, runners::CaseExecutor& executor,
                                      const UnitStageOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  UnitStageSummary summary;
  summary.run_id = options.run_id.empty() ? NewRunId(options.backend, "unit") : options.run_id;

  COV_ASSIGN_OR_RETURN(auto cases, registry.FindCases(options.filter));
  if (cases.empty()) {
    return Status::NotFound("no op cases in the registry match the filters; `coverage registry query` with the same "
                            "filters shows what there is");
  }

  registry::RunRecord run;
  run.run_id = summary.run_id;
  run.stage = "unit";
  run.backend = options.backend;
  run.started_at = NowIso8601();
  run.libtorch_version = options.libtorch_version;
  run.host = options.host;
  run.git_revision = options.git_revision;
  run.config_json = options.config_json;
  COV_ASSIGN_OR_RETURN(auto stored_run, registry.CreateOrResumeRun(run, &summary.resumed));
  if (summary.resumed) COV_RETURN_IF_ERROR(CheckSameReplayConfig(stored_run, options));

  COV_ASSIGN_OR_RETURN(auto finished, registry.FinishedCaseIds(summary.run_id));
  COV_ASSIGN_OR_RETURN(auto in_flight_items, registry.InFlight(summary.run_id));
  const std::set<std::string> in_flight(in_flight_items.begin(), in_flight_items.end());
  if (options.shard.active()) {
    COV_RETURN_IF_ERROR(registry.StartShard(summary.run_id, options.shard.index, options.shard.count, options.host,
                                            NowIso8601()));
    std::erase_if(cases, [&](const registry::StoredCase& c) {
      const bool other = !options.shard.Contains(c.key);
      summary.outside_shard += other;
      return other;
    });
  }
  summary.planned = static_cast<int64_t>(cases.size());

  std::vector<const registry::StoredCase*> todo;
  for (const auto& c : cases) {
    // Marks of cases outside this invocation's filter or shard stay for the
    // invocation that runs them.
    summary.was_in_flight += in_flight.count("case:" + std::to_string(c.case_id));
    if (finished.count(c.case_id)) {
      ++summary.already_done;
    } else {
      todo.push_back(&c);
    }
  }

  Progress progress(fmt::format("unit {} on {}", summary.run_id, options.backend), static_cast<int64_t>(todo.size()),
                    options.progress);
  int64_t failures = 0;
  for (size_t i = 0; i < todo.size(); ++i) {
    if (options.stop && options.stop->load()) {
      summary.interrupted = true;
      break;
    }
    const registry::StoredCase& c = *todo[i];
    CaseResult result;
    if (options.max_case_flops && c.cost.flops > *options.max_case_flops) {
      result.outcome = Outcome::kSkipped;
      result.error = fmt::format("estimated {:.3g} FLOPs exceeds --max-case-flops {:.3g}", c.cost.flops,
                                 *options.max_case_flops);
      ++summary.skipped_by_cost;
    } else {
      COV_RETURN_IF_ERROR(registry.MarkInFlight(summary.run_id, "case:" + std::to_string(c.case_id), options.host,
                                                getpid()));
      result = executor.Run(c.op_case);
      COV_RETURN_IF_ERROR(executor.HarnessStatus());
      ++summary.executed;
      summary.compute_seconds += result.timing.ComputeUs() / 1e6;
    }
    if (IsUnexpectedFailure(result.outcome)) ++failures;
    COV_RETURN_IF_ERROR(registry.RecordResult(ToRecord(summary.run_id, c.case_id, result)));
    progress.Update(static_cast<int64_t>(i + 1),
                    fmt::format("{} failing | {}", failures, c.op_case.QualifiedName()));
  }
  progress.Finish();

  // Summarise the whole run, including cases finished by earlier invocations.
  COV_ASSIGN_OR_RETURN(auto results, registry.ResultsForRun(summary.run_id));
  std::unordered_map<int64_t, const registry::StoredCase*> by_id;
  for (const auto& c : cases) by_id[c.case_id] = &c;
  for (const auto& r : results) {
    auto it = by_id.find(r.case_id);
    if (it == by_id.end()) continue;  // outside this invocation's filter
    ++summary.per_op[it->second->op_case.QualifiedName()].counts[r.outcome];
    ++summary.totals.counts[r.outcome];
    summary.flaky += r.flaky;
    summary.rerun += r.attempts > 1;
  }
  if (!summary.interrupted) {
    // A shard finishes its part; the run is finished when `coverage merge`
    // has every shard (Registry::MergeFrom).
    COV_RETURN_IF_ERROR(options.shard.active()
                            ? registry.FinishShard(summary.run_id, options.shard.index, options.shard.count,
                                                   NowIso8601())
                            : registry.FinishRun(summary.run_id, NowIso8601()));
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return summary;
}

}  // namespace coverage::stages

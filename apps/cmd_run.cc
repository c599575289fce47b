// `coverage run --stage=unit`: replays registry cases on a backend.
// `coverage run --stage=module,model,train`: runs representatives' modules,
// forward passes and training steps on a backend (stages/model_stage.h).
#include <algorithm>
#include <tuple>
#include <cstdlib>
#include <cstdio>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "apps/flags.h"
#include "apps/table.h"
#include "core/sha256.h"
#include "core/text_safety.h"
#include "registry/registry.h"
#include "backends/backends.h"
#include "isolation/isolation.h"
#include "replay/replay.h"
#include "stages/model_stage.h"
#include "stages/unit_stage.h"

namespace coverage::apps {
namespace {

// What a stage run says at once, e.g. that it takes over a run whose writer died.
void PrintNotice(const std::string& message) { std::fprintf(stderr, "coverage: %s\n", message.c_str()); }

struct RunFlags {
  std::string stage = "unit";
  std::string backend = "cpu";
  std::vector<std::string> ops;
  std::vector<std::string> keys;
  std::string model;
  std::string dtype;
  std::vector<std::string> dims;
  std::string profile;
  std::string source;  // unit: captured, opinfo or "" (both)
  std::optional<double> max_case_flops;
  double max_case_gb = 0;  // 0: half the machine's memory
  std::string run_id;
  int warm = 3;
  std::string golden = "auto";
  uint64_t seed = 0;
  std::string tolerances;
  bool list_backends = false;
  int show_failures = 10;
  // Model-level stages.
  int64_t selection_id = 0;
  std::string profiles;
  double max_gb = 8;
  double max_model_flops = 1e12;
  bool gate = false;
  int train_steps = 3;
  double min_cosine = 0.99;
  int64_t top_k = 5;
  double min_topk_agreement = 0.99;
  // Isolation and sharding.
  std::string isolation = "process";
  std::string isolation_config;
  std::optional<double> timeout;
  std::optional<int> reruns;
  std::string shard;
};

// --shard, else the environment (stages/shard.h); sharding needs one run id
// shared by every shard.
Result<stages::Shard> ResolveShard(const RunFlags& flags) {
  stages::Shard shard;
  if (!flags.shard.empty() && flags.shard != "auto") {
    COV_ASSIGN_OR_RETURN(shard, stages::ParseShard(flags.shard));
  } else {
    const bool engines = flags.shard == "auto";
    COV_ASSIGN_OR_RETURN(auto from_env,
                         stages::ShardFromEnvironment([](const char* n) { return std::getenv(n); }, engines));
    if (from_env) {
      shard = *from_env;
    } else if (engines) {
      return Status::InvalidArgument(
          "--shard auto: no shard in the environment (COVERAGE_SHARD_INDEX/COVERAGE_TOTAL_SHARDS, "
          "JOB_COMPLETION_INDEX with COVERAGE_TOTAL_SHARDS, or SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)");
    }
  }
  if (shard.active() && flags.run_id.empty()) {
    return Status::InvalidArgument("shard " + shard.ToString() +
                                   ": pass --run <id>, the same for every shard, so that `coverage merge` joins "
                                   "them into one run");
  }
  return shard;
}

// Worker processes for --isolation=process: the policy from
// configs/isolation.json, overridden by --timeout and --reruns.
// The first worker did not start: Ctrl-C while it loaded its backend is an
// interruption (130, nothing ran), anything else a harness error (2).
int StartFailed(const Status& started, const std::string& backend, const std::atomic<bool>* stop) {
  if (started.code() == StatusCode::kAborted && stop != nullptr && stop->load()) {
    std::fprintf(stderr, "coverage: %s; nothing ran\n", started.message().c_str());
    return kExitInterrupted;
  }
  return ReportError(started.WithContext("--backend " + backend));
}

Result<isolation::IsolationOptions> MakeIsolation(const GlobalOptions& global, const RunFlags& flags,
                                                isolation::WorkerSetup setup, const std::atomic<bool>* stop) {
  const std::string path =
      flags.isolation_config.empty() ? global.home + "/configs/isolation.json" : flags.isolation_config;
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  isolation::IsolationOptions options;
  options.stop = stop;
  COV_ASSIGN_OR_RETURN(options.policy, isolation::IsolationPolicy::FromJson(text, path));
  if (flags.timeout) {
    if (*flags.timeout <= 0) return Status::InvalidArgument("--timeout must be a positive number of seconds");
    options.policy.unit_timeout_s = *flags.timeout;
    options.policy.op_timeout_s.clear();
    for (auto& [stage, t] : options.policy.stage_timeout_s) t = *flags.timeout;
  }
  if (flags.reruns) options.policy.reruns = *flags.reruns;
  options.spawn.args = {"--home", global.home, "--quiet", "--threads", std::to_string(global.threads), "worker"};
  options.setup = std::move(setup);
  return options;
}

// "unit", or a comma-separated list of module, model and train.
Result<std::vector<std::string>> ParseStages(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string s;
  while (std::getline(in, s, ',')) {
    if (s == "unit" && text != "unit") {
      return Status::InvalidArgument("--stage: unit runs alone (its results are per op case); got '" + text + "'");
    }
    if (s != "unit" && s != "module" && s != "model" && s != "train") {
      return Status::InvalidArgument("--stage: '" + s + "' is not a stage (unit, module, model, train)");
    }
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  if (out.empty()) return Status::InvalidArgument("--stage is empty");
  return out;
}

// Where the results went, with a query to paste: the run id is an SQL
// literal inside one shell word (Note [Run ids] keeps it plain anyway).
void PrintWhereResultsAre(const GlobalOptions& global, const std::string& run_id, const std::string& view) {
  std::printf("\nresults: %s, run %s\n", global.registry_path.c_str(), run_id.c_str());
  const std::string sql = "SELECT * FROM " + view + " WHERE run_id = " + SqlQuote(run_id);
  // Double quotes read better and are safe without these characters.
  const bool plain = sql.find_first_of("\"$`\\!") == std::string::npos;
  const std::string word = plain ? "\"" + sql + "\"" : ShellQuote(sql);
  std::printf("  sqlite3 %s %s\n", ShellQuote(global.registry_path).c_str(), word.c_str());
}

void PrintIsolationStats(const isolation::IsolationStats& st, const std::string& tail) {
  std::printf("isolation: %lld workers started, %lld crashed, %lld timed out, %lld reruns (%lld in the same "
              "worker)%s\n",
              static_cast<long long>(st.workers_started), static_cast<long long>(st.crashes),
              static_cast<long long>(st.timeouts), static_cast<long long>(st.reruns),
              static_cast<long long>(st.same_worker_reruns), tail.c_str());
}

int RunModelStagesCommand(const GlobalOptions& global, const RunFlags& flags, const std::vector<std::string>& stages,
                           backends::BackendRegistry& backends, replay::ComparisonOptions comparison,
                           const std::string& tol_path, const std::string& tol_text, const std::atomic<bool>* stop);

int RunStage(const GlobalOptions& global, const RunFlags& flags) {
  // Before anything slow (starting workers): a Ctrl-C from then on stops
  // the run cleanly after its current case.
  const std::atomic<bool>* stop = InstallStopHandler();
  backends::BackendRegistry backends;
  RegisterBackends(global, backends);
  if (flags.list_backends) {
    for (const auto& b : backends.Describe()) {
      std::printf("%-18s %-11s %s%s\n", b.name.c_str(), b.available ? "available" : "unavailable", b.description.c_str(),
                  b.available ? "" : (" (" + b.reason + ")").c_str());
    }
    return kExitOk;
  }
  auto stages = ParseStages(flags.stage);
  if (!stages) return ReportError(stages.error());
  const std::string tol_path = flags.tolerances.empty() ? global.home + "/configs/tolerances.json" : flags.tolerances;
  auto tol_text = ReadFile(tol_path);
  if (!tol_text) return ReportError(tol_text.error().WithContext("--tolerances"));
  auto comparison = replay::ComparisonOptions::FromJson(*tol_text, tol_path);
  if (!comparison) return ReportError(comparison.error());
  if (stages->front() != "unit") {
    return RunModelStagesCommand(global, flags, *stages, backends, std::move(*comparison), tol_path, *tol_text, stop);
  }
  if (flags.max_case_flops && *flags.max_case_flops < 0) {
    return ReportError(Status::InvalidArgument("--max-case-flops must be non-negative"));
  }

  registry::CaseFilter filter;
  filter.ops = flags.ops;
  filter.keys = flags.keys;
  filter.model = flags.model;
  filter.profile = flags.profile;
  filter.source = flags.source;
  if (!flags.dtype.empty() && !DTypeFromName(flags.dtype)) {
    return ReportError(Status::InvalidArgument("--dtype '" + flags.dtype + "' is not a dtype (f32 bf16 f16 f64 i64 ...)"));
  }
  filter.dtype = flags.dtype;
  for (const auto& d : flags.dims) {
    auto p = registry::ParseDimPredicate(d);
    if (!p) return ReportError(p.error());
    filter.dims.push_back(*p);
  }

  auto shard = ResolveShard(flags);
  if (!shard) return ReportError(shard.error());
  auto reg = OpenRegistry(global, false);
  if (!reg) return ReportError(reg.error());
  auto count = (*reg)->CountCases();
  if (!count) return ReportError(count.error());
  if (*count == 0) {
    return ReportError(Status::NotFound("registry '" + global.registry_path +
                                        "' holds no op cases; run `coverage capture` first"));
  }

  isolation::WorkerSetup setup;
  setup.backend = flags.backend;
  setup.tolerances_json = *tol_text;
  setup.tolerances_source = tol_path;
  setup.warm_iterations = flags.warm;
  setup.golden = flags.golden == "always" ? replay::GoldenMode::kAlways
                 : flags.golden == "never" ? replay::GoldenMode::kNever
                                           : replay::GoldenMode::kWhenNeeded;
  setup.seed = flags.seed;
  std::unique_ptr<replay::CaseExecutor> executor;
  isolation::IsolatedCaseExecutor* isolated = nullptr;
  if (flags.isolation == "process") {
    // The parent never touches the backend: workers load it (Note [Worker processes]).
    auto isolation = MakeIsolation(global, flags, setup, stop);
    if (!isolation) return ReportError(isolation.error());
    auto e = std::make_unique<isolation::IsolatedCaseExecutor>(std::move(*isolation));
    Status started = e->Start();
    if (!started.ok()) return StartFailed(started, flags.backend, stop);
    isolated = e.get();
    executor = std::move(e);
  } else {
    auto backend = backends.Create(flags.backend);
    if (!backend) return ReportError(backend.error().WithContext("--backend"));
    ApplyHostSettings(global);
    auto replay = setup.Replay();
    if (!replay) return ReportError(replay.error());
    executor = std::make_unique<replay::ReplayExecutor>(*backend, std::move(*replay));
  }

  stages::UnitStageOptions options;
  options.run_id = flags.run_id;
  options.backend = flags.backend;
  options.libtorch_version = backends::LibtorchVersion();
  options.host = HostName();
  options.notice = PrintNotice;
  options.git_revision = GitRevision(global.home);
  options.filter = filter;
  options.max_case_flops = flags.max_case_flops;
  const double max_case_gb = flags.max_case_gb > 0 ? flags.max_case_gb : PhysicalMemoryGb() / 2;
  options.max_case_bytes = max_case_gb * 1e9;
  options.shard = *shard;
  options.progress = !global.quiet;
  options.stop = stop;
  // "replay" holds what changes results; resuming a run with other values is refused.
  nlohmann::json config = {
      {"stage", flags.stage},
      {"backend", flags.backend},
      {"filters", {{"ops", flags.ops}, {"cases", flags.keys}, {"model", flags.model}, {"dtype", flags.dtype}, {"dims", flags.dims},
                   {"profile", flags.profile}}},
      {"warm", flags.warm},
      {"tolerances", tol_path},
      {"replay", {{"golden", flags.golden}, {"seed", flags.seed}, {"tolerances_sha256", Sha256Hex(*tol_text)}}}};
  if (flags.max_case_flops) config["max_case_flops"] = *flags.max_case_flops;
  config["max_case_gb"] = max_case_gb;
  if (shard->active()) config["shard"] = shard->ToString();
  config["isolation"] = flags.isolation;
  options.config_json = config.dump();

  auto summary = stages::RunUnitStage(**reg, *executor, options);
  if (!summary) return ReportError(summary.error());

  // Per-op summary: one column per outcome that occurred.
  std::vector<Outcome> seen;
  for (Outcome o : kAllOutcomes) {
    if (summary->totals.counts.count(o)) seen.push_back(o);
  }
  Table t;
  t.headers = {"op", "cases"};
  t.numeric = {false, true};
  for (Outcome o : seen) {
    t.headers.emplace_back(OutcomeName(o));
    t.numeric.push_back(true);
  }
  for (const auto& [op, counts] : summary->per_op) {
    std::vector<std::string> row = {op, std::to_string(counts.Total())};
    for (Outcome o : seen) {
      auto it = counts.counts.find(o);
      row.push_back(it == counts.counts.end() ? "" : std::to_string(it->second));
    }
    t.rows.push_back(std::move(row));
  }
  std::vector<std::string> total_row = {"TOTAL", std::to_string(summary->totals.Total())};
  for (Outcome o : seen) total_row.push_back(std::to_string(summary->totals.counts.at(o)));
  t.rows.push_back(std::move(total_row));
  std::printf("%s", t.RenderAligned().c_str());

  std::printf("\nrun %s (stage unit, backend %s%s): %lld planned, %lld already done%s, %lld run now, %lld over the cost cap; %.1fs (%.0f%% in op compute)\n",
              summary->run_id.c_str(), flags.backend.c_str(),
              shard->active() ? fmt::format(", shard {}", shard->ToString()).c_str() : "",
              static_cast<long long>(summary->planned),
              static_cast<long long>(summary->already_done), summary->resumed ? " (resumed)" : "",
              static_cast<long long>(summary->executed), static_cast<long long>(summary->skipped_by_cost),
              summary->seconds, summary->seconds > 0 ? 100.0 * summary->compute_seconds / summary->seconds : 0.0);

  if (summary->was_in_flight > 0) {
    std::printf("%lld cases were in flight when an earlier invocation stopped; they ran again\n",
                static_cast<long long>(summary->was_in_flight));
  }
  if (isolated) {
    PrintIsolationStats(isolated->stats(), fmt::format("; whole run: {} cases rerun, {} flaky", summary->rerun,
                                                       summary->flaky));
  }
  if (summary->Failed() && flags.show_failures > 0) {
    auto rows = (*reg)->CaseResultsForRun(summary->run_id);
    if (rows) {
      std::vector<const registry::CaseResultRow*> failing;
      for (const auto& row : *rows) {
        if (IsUnexpectedFailure(row.result.outcome)) failing.push_back(&row);
      }
      std::sort(failing.begin(), failing.end(), [](const auto* a, const auto* b) {
        return std::tie(a->op, a->key) < std::tie(b->op, b->key);
      });
      if (failing.size() > static_cast<size_t>(flags.show_failures)) failing.resize(flags.show_failures);
      std::printf("\nfailing cases (first %d):\n", flags.show_failures);
      for (const auto* row : failing) {
        const std::string& e = row->result.error;
        std::string err = e.size() > 300 ? e.substr(0, 297) + "..." : e;
        std::printf("  %s %s\n    %s: %s\n", row->key.c_str(), row->summary.c_str(),
                    std::string(OutcomeName(row->result.outcome)).c_str(), err.c_str());
      }
    }
  }
  PrintWhereResultsAre(global, summary->run_id, "v_failures_per_op");
  if (summary->interrupted) {
    std::printf("interrupted: resume with --run %s\n", ShellQuote(summary->run_id).c_str());
    return kExitInterrupted;
  }
  return summary->Failed() ? kExitFailures : kExitOk;
}


int RunModelStagesCommand(const GlobalOptions& global, const RunFlags& flags, const std::vector<std::string>& stages,
                          backends::BackendRegistry& backends, replay::ComparisonOptions comparison,
                          const std::string& tol_path, const std::string& tol_text, const std::atomic<bool>* stop) {
  if (!flags.ops.empty() || !flags.keys.empty() || !flags.dtype.empty() || !flags.dims.empty() ||
      flags.max_case_flops || flags.max_case_gb > 0) {
    return ReportError(Status::InvalidArgument("--op, --case, --dtype, --dim, --max-case-flops and --max-case-gb "
                                               "filter op cases: they apply to --stage=unit only"));
  }
  if (flags.max_model_flops < 0) return ReportError(Status::InvalidArgument("--max-model-flops must be non-negative"));
  if (flags.max_gb <= 0) return ReportError(Status::InvalidArgument("--max-gb must be positive"));
  const std::string profiles_path =
      flags.profiles.empty() ? global.home + "/configs/capture_profiles.json" : flags.profiles;
  auto profiles = LoadProfiles(profiles_path, {});
  if (!profiles) return ReportError(profiles.error().WithContext("--profiles"));
  auto profiles_text = ReadFile(profiles_path);
  if (!profiles_text) return ReportError(profiles_text.error().WithContext("--profiles"));
  if (!flags.profile.empty()) {
    bool known = false;
    for (const auto& p : *profiles) known |= p.name == flags.profile;
    if (!known) return ReportError(Status::InvalidArgument("--profile '" + flags.profile + "' is not in " + profiles_path));
  }
  auto shard = ResolveShard(flags);
  if (!shard) return ReportError(shard.error());
  auto reg = OpenRegistry(global, false);
  if (!reg) return ReportError(reg.error());

  stages::ModelStageOptions options;
  options.stages = stages;
  options.run_id = flags.run_id;
  options.backend = flags.backend;
  options.libtorch_version = backends::LibtorchVersion();
  options.host = HostName();
  options.notice = PrintNotice;
  options.git_revision = GitRevision(global.home);
  options.selection_id = flags.selection_id;
  if (!flags.model.empty()) options.models = {flags.model};
  options.profiles = std::move(*profiles);
  options.profile = flags.profile;
  options.max_bytes = flags.max_gb * 1e9;
  if (flags.max_model_flops > 0) options.max_model_flops = flags.max_model_flops;
  options.gate = flags.gate;
  options.checks.seed = flags.seed;
  options.checks.comparison = std::move(comparison);
  options.checks.golden = flags.golden == "always" ? replay::GoldenMode::kAlways
                          : flags.golden == "never" ? replay::GoldenMode::kNever
                                                    : replay::GoldenMode::kWhenNeeded;
  options.checks.train_steps = flags.train_steps;
  options.checks.min_cosine = flags.min_cosine;
  options.checks.top_k = flags.top_k;
  options.checks.min_topk_agreement = flags.min_topk_agreement;
  options.shard = *shard;
  options.progress = !global.quiet;
  options.stop = stop;
  // "checks" holds what changes verdicts; resuming a run with other values is refused.
  nlohmann::json config = {
      {"stage", flags.stage},
      {"backend", flags.backend},
      {"selection", flags.selection_id},
      {"model", flags.model},
      {"profile", flags.profile},
      {"profiles", profiles_path},
      {"max_model_flops", flags.max_model_flops},
      {"gate", flags.gate},
      {"tolerances", tol_path},
      {"checks",
       {{"golden", flags.golden}, {"seed", flags.seed}, {"tolerances_sha256", Sha256Hex(tol_text)},
        {"profile", flags.profile}, {"profiles_sha256", Sha256Hex(*profiles_text)},
        {"train_steps", flags.train_steps}, {"min_cosine", flags.min_cosine}, {"top_k", flags.top_k},
        {"min_topk_agreement", flags.min_topk_agreement}}}};
  if (shard->active()) config["shard"] = shard->ToString();
  config["isolation"] = flags.isolation;
  options.config_json = config.dump();

  std::unique_ptr<replay::ProgramStageRunner> runner;
  isolation::IsolatedModelStageRunner* isolated = nullptr;
  std::shared_ptr<backends::Backend> in_process_backend;
  if (flags.isolation == "process") {
    isolation::WorkerSetup setup;
    setup.backend = flags.backend;
    setup.tolerances_json = tol_text;
    setup.tolerances_source = tol_path;
    setup.golden = options.checks.golden;
    setup.seed = flags.seed;
    setup.checks = options.checks;
    setup.registry = global.registry_path;
    auto isolation = MakeIsolation(global, flags, std::move(setup), stop);
    if (!isolation) return ReportError(isolation.error());
    auto r = std::make_unique<isolation::IsolatedModelStageRunner>(std::move(*isolation));
    Status started = r->Start();
    if (!started.ok()) return StartFailed(started, flags.backend, stop);
    isolated = r.get();
    runner = std::move(r);
  } else {
    auto backend = backends.Create(flags.backend);
    if (!backend) return ReportError(backend.error().WithContext("--backend"));
    ApplyHostSettings(global);
    in_process_backend = *backend;
    replay::ProgramReplayOptions replay;
    replay.check = options.checks;
    runner = std::make_unique<replay::InProcessProgramStageRunner>(*in_process_backend, replay);
  }
  auto summary = stages::RunModelStages(**reg, *runner, options);
  if (!summary) return ReportError(summary.error());

  // Per stage: models by outcome (one column per outcome that occurred).
  std::vector<Outcome> seen;
  for (Outcome o : kAllOutcomes) {
    for (const auto& [stage, counts] : summary->per_stage) {
      if (counts.count(o) && std::find(seen.begin(), seen.end(), o) == seen.end()) seen.push_back(o);
    }
  }
  Table t;
  t.headers = {"stage", "models"};
  t.numeric = {false, true};
  for (Outcome o : seen) {
    t.headers.emplace_back(OutcomeName(o));
    t.numeric.push_back(true);
  }
  for (const std::string& stage : stages) {
    auto it = summary->per_stage.find(stage);
    if (it == summary->per_stage.end()) continue;
    int64_t total = 0;
    for (const auto& [o, n] : it->second) total += n;
    std::vector<std::string> row = {stage, std::to_string(total)};
    for (Outcome o : seen) {
      auto c = it->second.find(o);
      row.push_back(c == it->second.end() ? "" : std::to_string(c->second));
    }
    t.rows.push_back(std::move(row));
  }
  std::printf("%s", t.RenderAligned().c_str());
  for (const auto& [stage, items] : summary->failing_items) {
    std::string line;
    for (const auto& [item, n] : items) line += fmt::format("{}{} ({})", line.empty() ? "" : ", ", item, n);
    std::printf("  failing %s items: %s\n", stage.c_str(), line.c_str());
  }
  std::printf("\nrun %s (stages %s, backend %s): %lld models, %lld stage runs now, %lld already done%s, "
              "%lld over a cost cap, %lld blocked by the gate, %lld without a captured program; %.1fs\n",
              summary->run_id.c_str(), flags.stage.c_str(), flags.backend.c_str(),
              static_cast<long long>(summary->models), static_cast<long long>(summary->executed),
              static_cast<long long>(summary->already_done), summary->resumed ? " (resumed)" : "",
              static_cast<long long>(summary->skipped_by_cost), static_cast<long long>(summary->blocked),
              static_cast<long long>(summary->not_captured), summary->seconds);
  if (summary->was_in_flight > 0) {
    std::printf("%lld stages were in flight when an earlier invocation stopped; they ran again\n",
                static_cast<long long>(summary->was_in_flight));
  }
  if (isolated) PrintIsolationStats(isolated->stats(), fmt::format(", {} flaky", isolated->stats().flaky));
  if (!summary->not_captured_reasons.empty()) {
    std::vector<std::pair<int64_t, std::string>> reasons;
    for (const auto& [why, n] : summary->not_captured_reasons) reasons.emplace_back(n, why);
    std::sort(reasons.rbegin(), reasons.rend());
    std::printf("\nstage runs without a captured program (skipped; the reason of each is in model_results), by "
                "capture status:\n");
    for (size_t i = 0; i < reasons.size() && i < 5; ++i) {
      std::printf("  %4lld  %s\n", static_cast<long long>(reasons[i].first), reasons[i].second.c_str());
    }
  }
  if (summary->skipped_by_cost > 0) {
    std::printf("\n%lld stage runs over a cost cap: their estimates are in model_results (outcome 'skipped'); raise "
                "--max-model-flops or --max-gb to run them\n",
                static_cast<long long>(summary->skipped_by_cost));
  }
  if (!summary->failures.empty() && flags.show_failures > 0) {
    std::printf("\nfailures (%zu of %lld):\n",
                std::min(summary->failures.size(), static_cast<size_t>(flags.show_failures)),
                static_cast<long long>(summary->failing_total));
    for (size_t i = 0; i < summary->failures.size() && static_cast<int>(i) < flags.show_failures; ++i) {
      const std::string& f = summary->failures[i];
      std::printf("  %s\n", f.size() > 400 ? (f.substr(0, 397) + "...").c_str() : f.c_str());
    }
  }
  PrintWhereResultsAre(global, summary->run_id, "v_model_failures");
  if (summary->interrupted) {
    std::printf("interrupted: resume with --run %s\n", ShellQuote(summary->run_id).c_str());
    return kExitInterrupted;
  }
  return summary->Failed() ? kExitFailures : kExitOk;
}

}  // namespace

void AddRunCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<RunFlags>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Run a test stage on a backend against the CPU reference and store each result as it completes.\n"
      "Exit code: 0 nothing failed unexpectedly, 1 failures, 2 bad input or harness error, 130 interrupted.");
  cmd->add_option("--stage", flags->stage,
                  "unit (op cases from the registry), or module, model and/or train, comma-separated (the "
                  "selection's representatives, built from their configs)")
      ->capture_default_str();
  cmd->add_option("--backend", flags->backend, "Backend under test (--list-backends shows them)")->capture_default_str();
  cmd->add_flag("--list-backends", flags->list_backends, "List the backends of this build and exit");
  cmd->add_option("--op", flags->ops, "Only cases of this op (repeatable), e.g. mm or aten::addmm");
  cmd->add_option("--case", flags->keys, "Only this case, by key (repeatable; `coverage repro KEY` prints one)");
  cmd->add_option("--model", flags->model,
                  "unit: only cases captured from this model; module/model/train: only these representatives; * and "
                  "? are wildcards");
  cmd->add_option("--dtype", flags->dtype, "Only cases with a tensor of this dtype");
  cmd->add_option("--dim", flags->dims, "Dimension predicate as in `registry query` (repeatable)");
  cmd->add_option("--profile", flags->profile,
                  "unit: only cases captured under this input profile; module/model/train: run under this profile "
                  "[default: the first that applies, see configs/capture_profiles.json]");
  cmd->add_option("--source", flags->source,
                  "unit: only cases captured from a model (captured) or from an OpInfo sample (opinfo, `coverage "
                  "import opinfo`) [default: both]")
      ->check(CLI::IsMember({"captured", "opinfo"}));
  cmd->add_option("--max-case-flops", flags->max_case_flops,
                  "Record costlier cases as skipped instead of running them")
      ->check(FiniteRange(0, 1e30));
  cmd->add_option("--max-case-gb", flags->max_case_gb,
                  "unit: record a case as skipped when replaying it would hold more memory than this (its inputs and "
                  "outputs on the reference and the backend, and the fp64 golden) [default: half the machine's memory]")
      ->check(FiniteRange(0.001, 1e6));
  cmd->add_option("--run", flags->run_id,
                  "Run id (letters, digits, '.', '_', '-'; it names the report folder); an existing id resumes that "
                  "run, skipping finished cases")
      ->check(RunIdCheck());
  cmd->add_option("--warm", flags->warm, "Warm backend calls after the first (latency = their median)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--golden", flags->golden,
                  "fp64 golden run: auto (only when an output misses the reference tolerance), always (error ratio "
                  "for every case), never")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->add_option("--seed", flags->seed, "Mixed into every case's input seed")->capture_default_str();
  cmd->add_option("--tolerances", flags->tolerances, "Tolerance config [default: <home>/configs/tolerances.json]");
  cmd->add_option("--show-failures", flags->show_failures, "Failing cases to print")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  // Model-level stages.
  cmd->add_option("--selection-id", flags->selection_id,
                  "module/model/train: representatives of this selection [default: the latest]");
  cmd->add_option("--profiles", flags->profiles,
                  "module/model/train: input profiles [default: <home>/configs/capture_profiles.json]");
  cmd->add_option("--max-gb", flags->max_gb,
                  "module/model/train: skip a model's stage whose program needs more memory than this to replay "
                  "(its largest live set, on the backend and the reference)")
      ->capture_default_str()
      ->check(FiniteRange(0.001, 1e6));
  cmd->add_option("--max-model-flops", flags->max_model_flops,
                  "module/model/train: skip a model's stage estimated above this many FLOPs (0: no cap)")
      ->capture_default_str()
      ->check(FiniteRange(0, 1e30));
  cmd->add_flag("--gate", flags->gate,
                "module/model/train: skip a model's later stages once an earlier one failed, recording what blocked them");
  cmd->add_option("--train-steps", flags->train_steps,
                  "train: replays of the captured step program (forward, loss, backward, optimizer), parameters "
                  "carried over")->capture_default_str()->check(
      CLI::Range(1, 1000));
  cmd->add_option("--min-cosine", flags->min_cosine, "module/model: minimum cosine similarity of the outputs")
      ->capture_default_str()
      ->check(FiniteRange(-1.0, 1.0));
  cmd->add_option("--top-k", flags->top_k, "model: the backend's top-1 token must be in the reference's top-k")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_option("--min-topk-agreement", flags->min_topk_agreement,
                  "model: share of positions where it must be")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1.0));
  // Isolation and sharding.
  cmd->add_option("--isolation", flags->isolation,
                  "process: each case runs in a worker process (a crash or hang costs that case, which is rerun "
                  "alone in a fresh worker); none: in this process (faster, but a crash ends the run)")
      ->capture_default_str()
      ->check(CLI::IsMember({"process", "none"}));
  cmd->add_option("--isolation-config", flags->isolation_config,
                  "Timeouts and reruns [default: <home>/configs/isolation.json]");
  cmd->add_option("--timeout", flags->timeout,
                  "Seconds one case (or one model stage) may take before it is killed as a timeout; overrides "
                  "the config")
      ->check(FiniteRange(0.1, 7 * 86400.0));
  cmd->add_option("--reruns", flags->reruns, "Reruns of a failing case (a wrong answer first in the same worker, then in fresh workers); overrides the config")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--shard", flags->shard,
                  "Run shard i of N (\"i/N\"): the cases (unit) or models whose key hashes to i; default from "
                  "COVERAGE_SHARD_INDEX/COVERAGE_TOTAL_SHARDS. \"auto\": from those or the engine's, "
                  "JOB_COMPLETION_INDEX (with COVERAGE_TOTAL_SHARDS) or SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT. "
                  "Needs --run; join shards with `coverage merge`");
  cmd->callback([&global, flags]() { global.exit_code = RunStage(global, *flags); });
}

}  // namespace coverage::apps

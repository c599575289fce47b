// `coverage run --stage=unit`: replays registry cases on a backend.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "apps/table.h"
#include "core/sha256.h"
#include "registry/registry.h"
#include "runners/backends.h"
#include "runners/replay.h"
#include "stages/unit_stage.h"

namespace coverage::apps {
namespace {

struct RunFlags {
  std::string stage = "unit";
  std::string backend = "cpu";
  std::vector<std::string> ops;
  std::string model;
  std::string dtype;
  std::vector<std::string> dims;
  std::string profile;
  std::optional<double> max_case_flops;
  std::string run_id;
  int warm = 3;
  std::string golden = "auto";
  uint64_t seed = 0;
  std::string tolerances;
  bool list_backends = false;
  int show_failures = 10;
};

// Explicit registration (no static constructors): every backend this build offers.
runners::BackendRegistry MakeBackends() {
  runners::BackendRegistry backends;
  runners::RegisterCpuBackend(backends);
  return backends;
}

int RunStage(const GlobalOptions& global, const RunFlags& flags) {
  runners::BackendRegistry backends = MakeBackends();
  if (flags.list_backends) {
    for (const auto& [name, description] : backends.List()) std::printf("%-12s %s\n", name.c_str(), description.c_str());
    return kExitOk;
  }
  const std::string tol_path = flags.tolerances.empty() ? global.home + "/configs/tolerances.json" : flags.tolerances;
  auto tol_text = ReadFile(tol_path);
  if (!tol_text) return ReportError(tol_text.error().WithContext("--tolerances"));
  auto comparison = runners::ComparisonOptions::FromJson(*tol_text, tol_path);
  if (!comparison) return ReportError(comparison.error());
  if (flags.max_case_flops && *flags.max_case_flops < 0) {
    return ReportError(Status::InvalidArgument("--max-case-flops must be non-negative"));
  }

  registry::CaseFilter filter;
  filter.ops = flags.ops;
  filter.model = flags.model;
  filter.profile = flags.profile;
  if (!flags.dtype.empty() && !DTypeFromName(flags.dtype)) {
    return ReportError(Status::InvalidArgument("--dtype '" + flags.dtype + "' is not a dtype (f32 bf16 f16 f64 i64 ...)"));
  }
  filter.dtype = flags.dtype;
  for (const auto& d : flags.dims) {
    auto p = registry::ParseDimPredicate(d);
    if (!p) return ReportError(p.error());
    filter.dims.push_back(*p);
  }

  auto backend = backends.Create(flags.backend);
  if (!backend) return ReportError(backend.error().WithContext("--backend"));
  auto reg = OpenRegistry(global, false);
  if (!reg) return ReportError(reg.error());
  auto count = (*reg)->CountCases();
  if (!count) return ReportError(count.error());
  if (*count == 0) {
    return ReportError(Status::NotFound("registry '" + global.registry_path +
                                        "' holds no op cases; run `coverage capture` first"));
  }

  ApplyHostSettings(global);
  runners::ReplayOptions replay;
  replay.comparison = std::move(*comparison);
  replay.warm_iterations = flags.warm;
  replay.golden = flags.golden == "always" ? runners::GoldenMode::kAlways
                  : flags.golden == "never" ? runners::GoldenMode::kNever
                                            : runners::GoldenMode::kWhenNeeded;
  replay.seed = flags.seed;
  runners::ReplayExecutor executor(*backend, replay);

  stages::UnitStageOptions options;
  options.run_id = flags.run_id;
  options.backend = flags.backend;
  options.libtorch_version = runners::LibtorchVersion();
  options.host = HostName();
  options.git_revision = GitRevision(global.home);
  options.filter = filter;
  options.max_case_flops = flags.max_case_flops;
  options.progress = !global.quiet;
  options.stop = InstallStopHandler();
  // "replay" holds what changes results; resuming a run with other values is refused.
  nlohmann::json config = {
      {"stage", flags.stage},
      {"backend", flags.backend},
      {"filters", {{"ops", flags.ops}, {"model", flags.model}, {"dtype", flags.dtype}, {"dims", flags.dims},
                   {"profile", flags.profile}}},
      {"warm", flags.warm},
      {"tolerances", tol_path},
      {"replay", {{"golden", flags.golden}, {"seed", flags.seed}, {"tolerances_sha256", Sha256Hex(*tol_text)}}}};
  if (flags.max_case_flops) config["max_case_flops"] = *flags.max_case_flops;
  options.config_json = config.dump();

  auto summary = stages::RunUnitStage(**reg, executor, options);
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

  std::printf("\nrun %s (stage unit, backend %s): %lld planned, %lld already done%s, %lld run now, %lld over the cost cap; %.1fs (%.0f%% in op compute)\n",
              summary->run_id.c_str(), flags.backend.c_str(), static_cast<long long>(summary->planned),
              static_cast<long long>(summary->already_done), summary->resumed ? " (resumed)" : "",
              static_cast<long long>(summary->executed), static_cast<long long>(summary->skipped_by_cost),
              summary->seconds, summary->seconds > 0 ? 100.0 * summary->compute_seconds / summary->seconds : 0.0);

  if (summary->Failed() && flags.show_failures > 0) {
    auto failing = (*reg)->Query(
        "SELECT key, summary, outcome, error FROM v_results WHERE run_id = ?1 AND outcome NOT IN "
        "('pass','skipped','expected_failure') ORDER BY op, key LIMIT " + std::to_string(flags.show_failures),
        {summary->run_id});
    if (failing) {
      std::printf("\nfailing cases (first %d):\n", flags.show_failures);
      for (const auto& row : failing->rows) {
        std::string err = row[3].size() > 300 ? row[3].substr(0, 297) + "..." : row[3];
        std::printf("  %s %s\n    %s: %s\n", row[0].c_str(), row[1].c_str(), row[2].c_str(), err.c_str());
      }
    }
  }
  std::printf("\nresults: %s, run %s\n", global.registry_path.c_str(), summary->run_id.c_str());
  std::printf("  sqlite3 %s \"SELECT * FROM v_failures_per_op WHERE run_id = '%s'\"\n", global.registry_path.c_str(),
              summary->run_id.c_str());
  if (summary->interrupted) {
    std::printf("interrupted: resume with --run %s\n", summary->run_id.c_str());
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
  cmd->add_option("--stage", flags->stage, "Stage to run")->capture_default_str()->check(CLI::IsMember({"unit"}));
  cmd->add_option("--backend", flags->backend, "Backend under test (--list-backends shows them)")->capture_default_str();
  cmd->add_flag("--list-backends", flags->list_backends, "List the backends of this build and exit");
  cmd->add_option("--op", flags->ops, "Only cases of this op (repeatable), e.g. mm or aten::addmm");
  cmd->add_option("--model", flags->model, "Only cases captured from this model; * and ? are wildcards");
  cmd->add_option("--dtype", flags->dtype, "Only cases with a tensor of this dtype");
  cmd->add_option("--dim", flags->dims, "Dimension predicate as in `registry query` (repeatable)");
  cmd->add_option("--profile", flags->profile, "Only cases captured under this input profile");
  cmd->add_option("--max-case-flops", flags->max_case_flops,
                  "Record costlier cases as skipped instead of running them");
  cmd->add_option("--run", flags->run_id, "Run id; an existing id resumes that run, skipping finished cases");
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
  cmd->add_option("--show-failures", flags->show_failures, "Failing cases to print")->capture_default_str();
  cmd->callback([&global, flags]() { global.exit_code = RunStage(global, *flags); });
}

}  // namespace coverage::apps

// The cases family (Note [Test stages] in apps/test_stages.h): the unit
// stage, op cases from the registry replayed on a backend against the CPU
// reference (stages/unit_stage.h), in this process or in workers.
#include <algorithm>
#include <cstdio>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/flags.h"
#include "apps/table.h"
#include "apps/test_stages.h"
#include "backends/backends.h"
#include "core/sha256.h"
#include "core/text_safety.h"
#include "registry/registry.h"
#include "replay/replay.h"
#include "stages/unit_stage.h"

namespace coverage::apps {
namespace {

class CasesStages final : public TestStageFamily {
 public:
  CasesStages()
      : TestStageFamily({.name = "cases",
                         .request = "unit",
                         .stages = {"unit"},
                         .run_suffix = "-unit",
                         .nightly_args = "unit_args"}) {}
  Status Ready(registry::Registry&) const override { return Status::Ok(); }
  int Run(const RunContext& context, const std::vector<std::string>& stages) const override;
  nlohmann::json Answer(WorkerState& worker, const nlohmann::json& request, const nlohmann::json& body) const override;
};

int CasesStages::Run(const RunContext& context, const std::vector<std::string>& /*stages*/) const {
  const GlobalOptions& global = context.global;
  const RunFlags& flags = context.flags;
  if (!flags.models_file.empty() || flags.all_captured || flags.selection_id != 0) {
    return ReportError(Status::InvalidArgument("--models, --all-captured and --selection-id choose models for "
                                               "--stage=module, model or train; unit runs op cases (--model filters "
                                               "them by the model they were captured from)"));
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

  isolation::WorkerSetup setup = BaseWorkerSetup(context);
  setup.warm_iterations = flags.warm;
  isolation::IsolatedCaseExecutor* isolated = nullptr;
  std::string declared;  // the numerics the run is judged under
  backends::BackendIdentity identity;
  auto made = MakeExecutor<isolation::IsolatedCaseExecutor, replay::CaseExecutor>(
      context, setup,
      [&](std::shared_ptr<backends::Backend> backend,
          const isolation::WorkerSetup& resolved) -> Result<std::unique_ptr<replay::CaseExecutor>> {
        declared = resolved.checks.comparison.numerics.text;
        return std::unique_ptr<replay::CaseExecutor>(
            std::make_unique<replay::ReplayExecutor>(std::move(backend), resolved.Replay()));
      },
      &isolated, &identity);
  if (auto* rc = std::get_if<int>(&made)) return *rc;
  std::unique_ptr<replay::CaseExecutor> executor = std::move(std::get<0>(made));
  if (isolated) declared = isolated->declared_numerics();

  stages::UnitStageOptions options;
  FillStageRunOptions(context, *shard, &options);
  options.backend_name = identity.name;
  options.backend_version = identity.version;
  options.filter = filter;
  options.max_case_flops = flags.max_case_flops;
  const double max_case_gb = flags.max_case_gb > 0 ? flags.max_case_gb : PhysicalMemoryGb() / 2;
  options.max_case_bytes = max_case_gb * 1e9;
  // "replay" holds what changes results; resuming a run with other values is refused.
  nlohmann::json config = {
      {"stage", flags.stage},
      {"backend", flags.backend},
      {"filters", {{"ops", flags.ops}, {"cases", flags.keys}, {"model", flags.model}, {"dtype", flags.dtype}, {"dims", flags.dims},
                   {"profile", flags.profile}}},
      {"warm", flags.warm},
      {"tolerances", context.tolerances_path},
      {"replay",
       {{"golden", flags.golden}, {"seed", flags.seed}, {"tolerances_sha256", Sha256Hex(context.tolerances_text)},
        {"numerics", NumericsRecord(context, declared)}}}};
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
  Table t = OutcomeTable("op", "cases", seen);
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
        std::printf("  %s %s\n    %s: %s\n", TerminalSafe(row->key).c_str(), TerminalSafe(row->summary).c_str(),
                    std::string(OutcomeName(row->result.outcome)).c_str(), TerminalSafe(row->result.error, 297).c_str());
      }
    }
  }
  return FinishStageRun(global, summary->run_id, "v_failures_per_op", summary->interrupted, summary->Failed());
}

nlohmann::json CasesStages::Answer(WorkerState& worker, const nlohmann::json& request,
                                   const nlohmann::json& body) const {
  auto op_case = OpCase::FromJsonValue(body);
  if (!op_case) return {{"error", op_case.error().message()}};
  if (!worker.replay) worker.replay = std::make_unique<replay::ReplayExecutor>(worker.backend, worker.setup.Replay());
  // Note [Reruns] in isolation/isolation.cc: "again" is the same-worker rerun.
  const auto again = request.find("again");
  const bool rerun = again != request.end() && again->is_boolean() && again->get<bool>();
  return {{"result", (rerun ? worker.replay->RunAgain(*op_case) : worker.replay->Run(*op_case)).ToJsonValue()}};
}

}  // namespace

const TestStageFamily& CasesFamily() {
  static const CasesStages family;
  return family;
}

}  // namespace coverage::apps

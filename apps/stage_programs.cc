// The programs family (Note [Test stages] in apps/test_stages.h): the
// module, model and train stages, the selection's representatives replayed
// from their captured programs (stages/model_stage.h), in this process or
// in workers.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/table.h"
#include "apps/test_stages.h"
#include "backends/backends.h"
#include "core/json_double.h"
#include "core/sha256.h"
#include "core/text_safety.h"
#include "isolation/worker.h"
#include "registry/registry.h"
#include "replay/model_check.h"
#include "replay/program_replay.h"
#include "stages/model_stage.h"

namespace coverage::apps {
namespace {

// The model ids of `run --models FILE`: one per line, or capture's JSONL
// (an object with a string "id" per line); blank lines and # comments skipped.
Result<std::vector<std::string>> ReadModelIds(const std::string& path) {
  COV_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  std::vector<std::string> ids;
  std::map<std::string, int> line_of;
  size_t start = 0;
  for (int line_no = 1; start < text.size(); ++line_no) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    start = end + 1;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") + 1 - first);
    const std::string where = fmt::format("{}:{}", path, line_no);
    std::string id = line;
    if (line[0] == '{') {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string()) {
        return Status::InvalidArgument(where + ": a JSON line needs a string \"id\"");
      }
      id = j["id"].get<std::string>();
    }
    if (id.empty() || id.find_first_of(" \t") != std::string::npos) {
      return Status::InvalidArgument(where + ": '" + TerminalSafe(id) + "' is not a model id");
    }
    if (auto [it, fresh] = line_of.emplace(id, line_no); !fresh) {
      return Status::InvalidArgument(
          fmt::format("{}: model '{}' is also on line {}; give each id once", where, TerminalSafe(id), it->second));
    }
    ids.push_back(std::move(id));
  }
  if (ids.empty()) return Status::InvalidArgument(path + ": no model id in it");
  return ids;
}

class ProgramStages final : public TestStageFamily {
 public:
  ProgramStages()
      : TestStageFamily({.name = "programs",
                         .request = "model",
                         .stages = {std::begin(stages::kModelStages), std::end(stages::kModelStages)},
                         .timed = true,
                         .run_suffix = "-models",
                         .nightly_args = "model_args"}) {}
  Status Ready(registry::Registry& registry) const override {
    auto selection = registry.SelectionModels(0);
    if (!selection && selection.error().code() == StatusCode::kNotFound) {
      return Status::NotFound("no selection: these stages need representatives (`coverage crawl`, `coverage select`, "
                              "`coverage capture --selection`)");
    }
    return Status::Ok();
  }
  int Run(const RunContext& context, const std::vector<std::string>& stages) const override;
  nlohmann::json Answer(WorkerState& worker, const nlohmann::json& request, const nlohmann::json& body) const override;
};

int ProgramStages::Run(const RunContext& context, const std::vector<std::string>& stages) const {
  const GlobalOptions& global = context.global;
  const RunFlags& flags = context.flags;

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
  FillStageRunOptions(context, *shard, &options);
  options.stages = stages;
  options.selection_id = flags.selection_id;
  options.all_captured = flags.all_captured;
  if (!flags.models_file.empty()) {
    auto ids = ReadModelIds(flags.models_file);
    if (!ids) return ReportError(ids.error().WithContext("--models"));
    options.model_ids = std::move(*ids);
  }
  if (!flags.model.empty()) options.models = {flags.model};
  options.profiles = std::move(*profiles);
  options.profile = flags.profile;
  options.max_bytes = flags.max_gb * 1e9;
  if (flags.max_model_flops > 0) options.max_model_flops = flags.max_model_flops;
  options.gate = flags.gate;
  options.checks.seed = flags.seed;
  options.checks.comparison = context.comparison;
  options.checks.golden = GoldenModeOf(flags.golden);
  options.checks.train_steps = flags.train_steps;
  options.checks.min_cosine = flags.min_cosine;
  options.checks.top_k = flags.top_k;
  options.checks.min_topk_agreement = flags.min_topk_agreement;
  // "checks" holds what changes verdicts; resuming a run with other values is refused.
  nlohmann::json config = {
      {"stage", flags.stage},
      {"backend", flags.backend},
      {"selection", flags.selection_id},
      {"models", options.model_ids},
      {"all_captured", flags.all_captured},
      {"model", flags.model},
      {"profile", flags.profile},
      {"profiles", profiles_path},
      {"max_model_flops", flags.max_model_flops},
      {"gate", flags.gate},
      {"tolerances", context.tolerances_path},
      {"checks",
       {{"golden", flags.golden}, {"seed", flags.seed}, {"tolerances_sha256", Sha256Hex(context.tolerances_text)},
        {"profile", flags.profile}, {"profiles_sha256", Sha256Hex(*profiles_text)},
        {"train_steps", flags.train_steps}, {"min_cosine", flags.min_cosine}, {"top_k", flags.top_k},
        {"min_topk_agreement", flags.min_topk_agreement}}}};
  if (shard->active()) config["shard"] = shard->ToString();
  config["isolation"] = flags.isolation;

  isolation::WorkerSetup setup = BaseWorkerSetup(context);
  setup.golden = options.checks.golden;
  setup.checks = options.checks;
  setup.registry = global.registry_path;
  isolation::IsolatedModelStageRunner* isolated = nullptr;
  std::shared_ptr<backends::Backend> in_process_backend;  // the in-process runner's, kept for its life
  std::string declared;  // the numerics the run is judged under
  backends::BackendIdentity identity;
  auto made = MakeExecutor<isolation::IsolatedModelStageRunner, replay::ProgramStageRunner>(
      context, std::move(setup),
      [&](std::shared_ptr<backends::Backend> backend,
          const isolation::WorkerSetup& resolved) -> Result<std::unique_ptr<replay::ProgramStageRunner>> {
        declared = resolved.checks.comparison.numerics.text;
        in_process_backend = std::move(backend);
        replay::ProgramReplayOptions replay;
        replay.check = resolved.checks;
        return std::unique_ptr<replay::ProgramStageRunner>(
            std::make_unique<replay::InProcessProgramStageRunner>(*in_process_backend, replay));
      },
      &isolated, &identity);
  if (auto* rc = std::get_if<int>(&made)) return *rc;
  options.backend_name = identity.name;
  options.backend_version = identity.version;
  std::unique_ptr<replay::ProgramStageRunner> runner = std::move(std::get<0>(made));
  if (isolated) declared = isolated->declared_numerics();
  config["checks"]["numerics"] = NumericsRecord(context, declared);
  options.config_json = config.dump();
  // The memory estimate counts the rounded copies of the declared ops'
  // operands (Note [Memory estimate]): the numerics the run is judged under.
  if (auto numerics = replay::DeclaredNumerics::FromJson(declared, "the backend's declared numerics")) {
    options.checks.comparison.numerics = std::move(*numerics);
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
  Table t = OutcomeTable("stage", "models", seen);
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
    std::printf("  failing %s items: %s\n", stage.c_str(), TerminalSafe(line).c_str());
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
      std::printf("  %4lld  %s\n", static_cast<long long>(reasons[i].first), TerminalSafe(reasons[i].second).c_str());
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
      std::printf("  %s\n", TerminalSafe(f, 397).c_str());
    }
  }
  return FinishStageRun(global, summary->run_id, "v_model_failures", summary->interrupted, summary->Failed());
}

nlohmann::json ProgramStages::Answer(WorkerState& worker, const nlohmann::json& /*request*/,
                                     const nlohmann::json& m) const {
  if (!m.is_object() || !m.contains("model_id") || !m["model_id"].is_string() || !m.contains("profile") ||
      !m["profile"].is_string()) {
    return {{"error", "model request: expected an object with 'stage', 'model_id' and 'profile'"}};
  }
  if (!worker.load_program || worker.setup.registry.empty()) {
    return {{"error", "model request: the worker was set up without a registry to load programs from"}};
  }
  auto program = worker.load_program(m["model_id"].get<std::string>(), m["profile"].get<std::string>());
  if (!program) return {{"error", "model request: " + program.error().message()}};
  replay::ProgramReplayOptions options;
  options.check = worker.setup.checks;
  if (auto skip = m.find("skip_modules"); skip != m.end()) {  // Note [A module that kills its worker]
    if (!skip->is_array()) return {{"error", "model request: 'skip_modules' must be an array of module paths"}};
    for (const auto& module : *skip) {
      if (!module.is_string()) return {{"error", "model request: 'skip_modules' must be an array of module paths"}};
      options.skip_modules.insert(module.get<std::string>());
    }
  }
  // Note [Where a worker died]: where it is, before each backend call.
  options.before_backend_call = [](const ProgramCall& call) {
    const std::string line = std::string(isolation::kProgressPrefix) +
                             DumpJson(nlohmann::json{{"call", call.index},
                                                     {"op", call.overload.empty() ? call.op : call.op + "." + call.overload},
                                                     {"module", call.module},
                                                     {"phase", call.phase}}) +
                             "\n";
    (void)!write(STDERR_FILENO, line.data(), line.size());
  };
  const auto stage = m.find("stage");
  const std::vector<ModelItemResult> items = replay::RunProgramStage(
      stage != m.end() && stage->is_string() ? stage->get<std::string>() : std::string(), *program, *worker.backend,
      options);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& item : items) out.push_back(item.ToJsonValue());
  return {{"items", out}};
}

}  // namespace

const TestStageFamily& ProgramsFamily() {
  static const ProgramStages family;
  return family;
}

}  // namespace coverage::apps

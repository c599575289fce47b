// `coverage capture`: builds the bundled registry from data/seed_models.jsonl.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "registry/registry.h"
#include "stages/capture_stage.h"

namespace coverage::apps {
namespace {

struct CaptureFlags {
  std::string models_path;
  std::string profiles_path;
  std::vector<std::string> only_models;
  std::vector<std::string> only_profiles;
  int max_depth = 0;
  double max_gb = 8;
  bool force = false;
  bool selection = false;
  int64_t selection_id = 0;
  int64_t max_layers = 2;
  bool no_meta = false;
};

Result<std::vector<runners::BlockModel>> LoadModels(const std::string& path, const std::vector<std::string>& only) {
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<runners::BlockModel> out;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) return Status::InvalidArgument(fmt::format("{}:{}: not valid JSON", path, line_no));
    auto m = runners::ParseBlockModel(j);
    if (!m) return m.error().WithContext(fmt::format("{}:{}", path, line_no));
    if (only.empty() || std::find(only.begin(), only.end(), m->id) != only.end()) out.push_back(std::move(*m));
  }
  for (const auto& id : only) {
    bool found = false;
    for (const auto& m : out) found |= m.id == id;
    if (!found) return Status::InvalidArgument("--model '" + id + "' is not in " + path);
  }
  return out;
}


int RunSelectionCaptureCommand(const GlobalOptions& global, const CaptureFlags& flags) {
  const std::string profiles_path =
      flags.profiles_path.empty() ? global.home + "/configs/capture_profiles.json" : flags.profiles_path;
  auto profiles = LoadProfiles(profiles_path, flags.only_profiles);
  if (!profiles) return ReportError(profiles.error());
  auto reg = OpenRegistry(global, /*read_only=*/false);
  if (!reg) return ReportError(reg.error());
  ApplyHostSettings(global);
  stages::SelectionCaptureOptions options;
  options.selection_id = flags.selection_id;
  options.only_models = flags.only_models;
  options.profiles = std::move(*profiles);
  options.max_layers = flags.max_layers;
  options.max_bytes = flags.max_gb * 1e9;
  options.meta_over_budget = !flags.no_meta;
  options.max_depth = flags.max_depth;
  options.force = flags.force;
  options.progress = !global.quiet;
  options.stop = InstallStopHandler();
  auto summary = stages::RunSelectionCapture(**reg, options);
  if (!summary) return ReportError(summary.error().WithContext("capture"));
  const auto& s = *summary;
  std::printf("capture of selection %lld (%lld representatives): %lld (model, profile) pairs built (%lld of them on "
              "meta tensors, over --max-gb), %lld not built, %lld failed, %lld done before\n",
              static_cast<long long>(s.selection_id), static_cast<long long>(s.representatives),
              static_cast<long long>(s.pairs_built), static_cast<long long>(s.pairs_meta),
              static_cast<long long>(s.pairs_not_built), static_cast<long long>(s.pairs_failed),
              static_cast<long long>(s.pairs_skipped));
  std::printf("  %lld calls recorded, %lld distinct cases in them, %lld new; registry now holds %lld cases\n",
              static_cast<long long>(s.calls), static_cast<long long>(s.cases_seen),
              static_cast<long long>(s.cases_new), static_cast<long long>(s.cases_total));
  if (s.models_without_profile > 0) {
    std::printf("  %lld representatives have no selected input profile for their structure\n",
                static_cast<long long>(s.models_without_profile));
  }
  std::vector<std::pair<int64_t, std::string>> reasons;
  for (const auto& [why, n] : s.not_built) reasons.emplace_back(n, why);
  std::sort(reasons.rbegin(), reasons.rend());
  for (size_t i = 0; i < reasons.size() && i < 10; ++i) {
    std::printf("  not built (%lld pairs): %s\n", static_cast<long long>(reasons[i].first), reasons[i].second.c_str());
  }
  std::printf("registry: %s (views v_build_coverage, v_build_failures)\n", global.registry_path.c_str());
  if (s.interrupted) {
    std::printf("interrupted: rerun the same command to capture the remaining pairs\n");
    return kExitInterrupted;
  }
  return kExitOk;
}

int RunCapture(const GlobalOptions& global, const CaptureFlags& flags) {
  if (flags.selection) return RunSelectionCaptureCommand(global, flags);
  const std::string models_path = flags.models_path.empty() ? global.home + "/data/seed_models.jsonl" : flags.models_path;
  const std::string profiles_path =
      flags.profiles_path.empty() ? global.home + "/configs/capture_profiles.json" : flags.profiles_path;
  auto models = LoadModels(models_path, flags.only_models);
  if (!models) return ReportError(models.error());
  auto profiles = LoadProfiles(profiles_path, flags.only_profiles);
  if (!profiles) return ReportError(profiles.error());
  if (flags.max_gb <= 0) return ReportError(Status::InvalidArgument("--max-gb must be positive"));
  auto reg = OpenRegistry(global, /*read_only=*/false, /*create=*/true);
  if (!reg) return ReportError(reg.error());
  ApplyHostSettings(global);

  stages::CaptureStageOptions options;
  options.models = std::move(*models);
  options.profiles = std::move(*profiles);
  options.max_depth = flags.max_depth;
  options.max_bytes = flags.max_gb * 1e9;
  options.force = flags.force;
  options.progress = !global.quiet;
  options.stop = InstallStopHandler();
  auto summary = stages::RunCaptureStage(**reg, options);
  if (!summary) return ReportError(summary.error());

  std::printf("capture: %lld (model, profile) pairs captured, %lld already captured, %lld refused\n",
              static_cast<long long>(summary->pairs_captured), static_cast<long long>(summary->pairs_skipped),
              static_cast<long long>(summary->pairs_refused));
  std::printf("  %lld calls recorded, %lld distinct cases in them, %lld new; registry now holds %lld cases\n",
              static_cast<long long>(summary->calls), static_cast<long long>(summary->cases_seen),
              static_cast<long long>(summary->cases_new), static_cast<long long>(summary->cases_total));
  if (summary->cases_pruned > 0) {
    std::printf("  %lld cases no longer produced by any capture were removed\n",
                static_cast<long long>(summary->cases_pruned));
  }
  for (const auto& r : summary->refusals) std::printf("  refused: %s\n", r.c_str());
  for (const auto& [why, n] : summary->uncaptured) {
    std::printf("  not captured (%lld calls): %s\n", static_cast<long long>(n), why.c_str());
  }
  std::printf("registry: %s\n", global.registry_path.c_str());
  if (summary->interrupted) {
    std::printf("interrupted: rerun the same command to capture the remaining pairs\n");
    return kExitInterrupted;
  }
  return summary->pairs_refused > 0 && summary->pairs_captured == 0 && summary->pairs_skipped == 0 ? kExitFailures
                                                                                                     : kExitOk;
}

}  // namespace

void AddCaptureCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<CaptureFlags>();
  CLI::App* cmd = app.add_subcommand(
      "capture",
      "Run the seed models' blocks at real dimensions under the op observer and store the op cases they execute.\n"
      "Resumable: (model, profile) pairs already captured are skipped.");
  cmd->add_option("--models", flags->models_path, "Seed models (JSONL) [default: <home>/data/seed_models.jsonl]");
  cmd->add_option("--profiles", flags->profiles_path,
                  "Input profiles [default: <home>/configs/capture_profiles.json]");
  cmd->add_option("--model", flags->only_models, "Capture only this model id (repeatable)");
  cmd->add_option("--profile", flags->only_profiles, "Capture only this profile (repeatable)");
  cmd->add_option("--max-depth", flags->max_depth, "Keep nested calls up to this depth (0 = top-level only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  cmd->add_option("--max-gb", flags->max_gb, "Refuse a (model, profile) whose estimated memory exceeds this")
      ->capture_default_str();
  cmd->add_flag("--force", flags->force, "Recapture pairs that were already captured");
  cmd->add_flag("--selection", flags->selection,
                "Build the representatives of a selection (coverage select) from their configs with the model\n"
                "builder and capture them, instead of the seed models");
  cmd->add_option("--selection-id", flags->selection_id, "With --selection: which selection (0 = the newest)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-layers", flags->max_layers, "With --selection: layers built per model (layers repeat)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_flag("--no-meta", flags->no_meta,
                "With --selection: refuse a (model, profile) over --max-gb instead of capturing its shapes on meta "
                "tensors");
  cmd->callback([&global, flags]() { global.exit_code = RunCapture(global, *flags); });
}

}  // namespace coverage::apps

// `coverage capture`: runs the capture tracer (capture/tracer/) on model
// configs, from a JSONL file (default: the bundled data/seed_models.jsonl)
// or a selection's representatives, and stores their programs and op cases
// (capture/tracer_capture.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "core/text_safety.h"
#include "apps/flags.h"
#include "capture/tracer_capture.h"
#include "core/json_capped.h"
#include "registry/registry.h"
#include "selection/features.h"
#include "capture/selection_models.h"
#include "selection/registry_select.h"

namespace coverage::apps {
namespace {

struct CaptureFlags {
  std::string models_path;
  std::string profiles_path;
  std::string defaults_path;
  std::vector<std::string> only_models;
  std::vector<std::string> only_profiles;
  bool force = false;
  bool fresh_tracers = false;
  bool selection = false;
  int64_t selection_id = 0;
  int64_t max_layers = 2;
  int64_t max_experts = 8;
  double max_gb = 8;
  std::string device = "auto";
  double timeout_s = 900;
  double tracer_memory_gb = 0;
  int jobs = 0;
  uint64_t seed = 0;
  std::string python;
};

// Lines of {"id", "config", "source"?, "structure"?}; the structure, when
// not given, is what the feature extractor reads from the config.
Result<std::vector<capture::CaptureModel>> LoadModels(const std::string& path, const std::vector<std::string>& only,
                                                      const selection::FamilyDefaults& defaults) {
  COV_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<capture::CaptureModel> out;
  std::istringstream in(text);
  std::string line;
  int line_no = 0;
  std::map<std::string, int> line_of;  // model id -> the line that gave it
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line_no);
    // Python's NaN and Infinity are accepted (real config.json files hold
    // them, e.g. Nemotron-H's time_step_limit) and reach the tracer as written.
    auto parsed = ParseJsonCapped(line, {.python_literals = true});
    if (!parsed) {
      try {
        const nlohmann::json strict = nlohmann::json::parse(line);
        (void)strict;
      } catch (const nlohmann::json::parse_error& e) {
        return Status::InvalidArgument(fmt::format("{}: not valid JSON (column {}): {}", where, e.byte, e.what()));
      } catch (const nlohmann::json::exception& e) {  // a number out of range (1e309)
        return Status::InvalidArgument(fmt::format("{}: {}", where, e.what()));
      }
      return Status::InvalidArgument(fmt::format("{}: {}", where, parsed.error().message()));
    }
    const nlohmann::json& j = *parsed;
    if (!j.is_object()) return Status::InvalidArgument(where + ": expected an object {\"id\", \"config\"}");
    if (!j.contains("id") || !j["id"].is_string() || j["id"].get<std::string>().empty()) {
      return Status::InvalidArgument(where + ": 'id' must be a non-empty string");
    }
    if (!j.contains("config") || !j["config"].is_object()) {
      return Status::InvalidArgument(where + ": 'config' must be the model's config.json object");
    }
    capture::CaptureModel m;
    m.id = j["id"].get<std::string>();
    if (auto [it, fresh] = line_of.emplace(m.id, line_no); !fresh) {
      return Status::InvalidArgument(fmt::format("{}: model '{}' is also on line {}; give each id once (only one "
                                                 "config could be stored under it)",
                                                 where, m.id, it->second));
    }
    if (!only.empty() && std::find(only.begin(), only.end(), m.id) == only.end()) continue;
    const nlohmann::json& config = j["config"];
    m.config_json = std::string(RawJsonMember(line, "config").value_or(config.dump()));
    if (config.contains("model_type") && config["model_type"].is_string()) {
      m.model_type = config["model_type"].get<std::string>();
    }
    m.source = j.contains("source") && j["source"].is_string() ? j["source"].get<std::string>() : path;
    // A config no model could be built from (hidden_size 10^12) is refused
    // here, naming the field, rather than inside libtorch in the tracer.
    auto f = selection::ExtractFeatures(config, defaults);
    if (!f) return Status::InvalidArgument(fmt::format("{}: model '{}': {}", where, m.id, f.error().message()));
    m.structure = j.contains("structure") && j["structure"].is_string() ? j["structure"].get<std::string>() : f->structure;
    out.push_back(std::move(m));
  }
  for (const auto& id : only) {
    if (std::none_of(out.begin(), out.end(), [&](const auto& m) { return m.id == id; })) {
      return Status::InvalidArgument("--model '" + id + "' is not in " + path);
    }
  }
  return out;
}

int RunCapture(const GlobalOptions& global, const CaptureFlags& flags) {
  const std::string profiles_path =
      flags.profiles_path.empty() ? global.home + "/configs/capture_profiles.json" : flags.profiles_path;
  auto profiles = LoadProfiles(profiles_path, flags.only_profiles);
  if (!profiles) return ReportError(profiles.error());
  auto reg = OpenRegistry(global, /*read_only=*/false, /*create=*/true);
  if (!reg) return ReportError(reg.error());

  capture::TracerCaptureOptions options;
  std::shared_ptr<const selection::FamilyDefaults> imported_defaults;  // a --models file's: features derived below
  if (flags.selection) {
    int64_t resolved = 0;
    auto models = capture::SelectionCaptureModels(**reg, flags.selection_id, flags.only_models, &resolved);
    if (!models) return ReportError(models.error().WithContext("capture --selection"));
    options.models = std::move(*models);
  } else {
    const std::string defaults_path =
        flags.defaults_path.empty() ? global.home + "/data/transformers_defaults.jsonl" : flags.defaults_path;
    auto defaults = selection::FamilyDefaults::Load(defaults_path);
    if (!defaults) return ReportError(defaults.error().WithContext("--defaults"));
    const std::string models_path =
        flags.models_path.empty() ? global.home + "/data/seed_models.jsonl" : flags.models_path;
    auto models = LoadModels(models_path, flags.only_models, **defaults);
    if (!models) return ReportError(models.error().WithContext("--models"));
    options.models = std::move(*models);
    imported_defaults = *defaults;
  }
  for (const auto& p : *profiles) options.profiles.push_back({p.name, p.families});
  capture::TracerSettings& t = options.tracer;
  t.python = TracerPython(global, flags.python);
  t.package_dir = global.home + "/capture/tracer";
  t.profiles_path = profiles_path;
  t.max_layers = flags.max_layers;
  t.max_experts = flags.max_experts;
  t.max_gb = flags.max_gb;
  t.device = flags.device;
  t.seed = flags.seed;
  t.server = !flags.fresh_tracers;
  t.timeout_s = flags.timeout_s;
  t.memory_limit_gb = flags.tracer_memory_gb;
  t.threads = global.threads;
  const double per_tracer_gb = flags.tracer_memory_gb > 0 ? flags.tracer_memory_gb : flags.max_gb + 3;
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  options.jobs = flags.jobs > 0 ? flags.jobs
                                : static_cast<int>(std::clamp<long>(
                                      std::min<long>(cores, static_cast<long>(PhysicalMemoryGb() / per_tracer_gb)), 1, 4));
  options.force = flags.force;
  options.progress = !global.quiet;
  options.stop = InstallStopHandler();

  auto summary = capture::RunTracerCapture(**reg, options);
  if (!summary) return ReportError(summary.error().WithContext("capture"));
  if (imported_defaults) {
    // The imported configs' features, as a crawl's get them in `coverage
    // select`: the model stages read each model's structure from them, and
    // select can choose among the imported models.
    selection::DeriveOptions derive;
    derive.stop = options.stop;
    auto features = selection::DeriveFeatures(**reg, *imported_defaults, derive);
    if (!features && !(summary->interrupted && features.error().code() == StatusCode::kAborted)) {
      return ReportError(features.error().WithContext("capture: deriving the models' features"));
    }
  }
  const auto& s = *summary;
  std::printf("capture: %lld (model, profile) pairs of %zu models in %.0f s with %d tracer jobs: %lld captured "
              "(%lld on meta, %lld on cpu), %lld not built, %lld refused, %lld failed, %lld not applicable, %lld "
              "done before\n",
              static_cast<long long>(s.pairs), options.models.size(), s.seconds, options.jobs,
              static_cast<long long>(s.captured), static_cast<long long>(s.on_meta), static_cast<long long>(s.on_cpu),
              static_cast<long long>(s.not_built), static_cast<long long>(s.refused),
              static_cast<long long>(s.failed), static_cast<long long>(s.not_applicable),
              static_cast<long long>(s.skipped));
  std::printf("  %lld calls recorded (%lld with an argument no op case holds), %lld distinct cases per pair summed, "
              "%lld new; registry now holds %lld cases\n",
              static_cast<long long>(s.calls), static_cast<long long>(s.unsupported_calls),
              static_cast<long long>(s.cases_seen), static_cast<long long>(s.cases_new),
              static_cast<long long>(s.cases_total));
  std::vector<std::pair<int64_t, std::string>> reasons;
  for (const auto& [why, n] : s.reasons) reasons.emplace_back(n, why);
  std::sort(reasons.begin(), reasons.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < reasons.size() && i < 10; ++i) {
    std::printf("  %lld pairs %s\n", static_cast<long long>(reasons[i].first), TerminalSafe(reasons[i].second).c_str());
  }
  std::printf("registry: %s (views v_capture_coverage, v_capture_failures; coverage registry programs)\n",
              global.registry_path.c_str());
  if (s.interrupted) {
    std::printf("interrupted: rerun the same command to capture the remaining pairs\n");
    return kExitInterrupted;
  }
  // Nothing traced at all is a failure a script must see; a pair that does
  // not build offline is a stored finding, not a failure of the command.
  return s.captured == 0 && s.skipped == 0 && s.failed + s.refused > 0 ? kExitFailures : kExitOk;
}

}  // namespace

void AddCaptureCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<CaptureFlags>();
  CLI::App* cmd = app.add_subcommand(
      "capture",
      "Trace real models (Hugging Face transformers, random weights, real dimensions, --max-layers deep) under\n"
      "each input profile and store their programs and op cases in the registry. Resumable: pairs already\n"
      "traced with the same tracer, depth and config are skipped. Models from --models (default: the bundled\n"
      "seed models) or from a selection (--selection).");
  cmd->add_option("--models", flags->models_path,
                  "Model configs, one JSON object per line: {\"id\", \"config\", \"source\"?, \"structure\"?}\n"
                  "[default: <home>/data/seed_models.jsonl]");
  cmd->add_flag("--selection", flags->selection, "Capture the representatives of a selection (coverage select)");
  cmd->add_option("--selection-id", flags->selection_id, "With --selection: which selection (0 = the newest)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  cmd->add_option("--model", flags->only_models, "Capture only this model id (repeatable)");
  cmd->add_option("--profile", flags->only_profiles, "Capture only this profile (repeatable)");
  cmd->add_option("--profiles", flags->profiles_path,
                  "Input profiles [default: <home>/configs/capture_profiles.json]");
  cmd->add_option("--defaults", flags->defaults_path,
                  "Family defaults for reading a model's structure [default: <home>/data/transformers_defaults.jsonl]");
  cmd->add_option("--max-layers", flags->max_layers, "Depth every repeated stack is cut to (dimensions never change)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  cmd->add_option("--max-experts", flags->max_experts,
                  "Experts every mixture-of-experts layer is cut to, at least the router's top-k (each expert keeps\n"
                  "its real shapes); 0 keeps them all")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  cmd->add_option("--max-gb", flags->max_gb,
                  "Memory budget of a trace on CPU tensors (meta traces allocate nothing); above it the pair is\n"
                  "refused with the estimate")
      ->capture_default_str()
      ->check(FiniteRange(0.01, 4096));
  cmd->add_option("--device", flags->device, "Where the tracer runs: auto (meta where every op has a meta kernel), meta, cpu")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "meta", "cpu"}));
  cmd->add_option("--timeout", flags->timeout_s, "Seconds one (model, profile) trace may take")
      ->capture_default_str()
      ->check(FiniteRange(1, 86400));
  cmd->add_option("--tracer-memory-gb", flags->tracer_memory_gb,
                  "Resident-memory limit of one tracer process [default: --max-gb + 3]")
      ->check(FiniteRange(0.5, 4096));
  cmd->add_option("--jobs", flags->jobs,
                  "Tracer processes at once [default: the cores, at most 4, as memory allows]")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--seed", flags->seed, "Seed of the traced inputs and CPU weights")->capture_default_str()
      ->check(SeedCheck());
  cmd->add_option("--python", flags->python,
                  "Python with torch and transformers [default: $COVERAGE_PYTHON, else <home>/.venv/bin/python]");
  cmd->add_flag("--force", flags->force, "Trace pairs again that were already traced");
  cmd->add_flag("--fresh-tracers", flags->fresh_tracers,
                "Start a new Python for every pair instead of forking it from a warm tracer per job (slower by the "
                "imports of torch and transformers, about 3 s a pair)");
  cmd->callback([&global, flags]() { global.exit_code = RunCapture(global, *flags); });
}

}  // namespace coverage::apps

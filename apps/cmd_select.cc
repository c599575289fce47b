// `coverage select`: derives features of crawled configs and chooses K
// representative models (selection/registry_select.h).
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/app.h"
#include "apps/flags.h"
#include "apps/table.h"
#include "core/progress.h"
#include "registry/registry.h"
#include "selection/registry_select.h"

namespace coverage::apps {
namespace {

struct SelectFlags {
  int k = 841;
  bool per_family = false;
  uint64_t seed = 0;
  std::string defaults;
  bool no_members = false;
  int show = 20;
};

std::string Percent(int64_t part, int64_t whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole)) : "-";
}

int RunSelectCommand(const GlobalOptions& global, const SelectFlags& flags) {
  const std::string defaults_path =
      flags.defaults.empty() ? global.home + "/data/transformers_defaults.jsonl" : flags.defaults;
  auto defaults = selection::FamilyDefaults::Load(defaults_path);
  if (!defaults) return ReportError(defaults.error().WithContext("--defaults"));
  auto reg = OpenRegistry(global, /*read_only=*/false);
  if (!reg) return ReportError(reg.error());

  selection::DeriveOptions derive;
  derive.stop = InstallStopHandler();
  Progress progress("features", 0, !global.quiet);
  derive.on_progress = [&](int64_t n) { progress.Update(n, fmt::format("{} configs read", n)); };
  auto features = selection::DeriveFeatures(**reg, **defaults, derive);
  progress.Finish();
  if (!features) {
    if (features.error().code() == StatusCode::kAborted) {
      std::printf("interrupted: %s\n", features.error().message().c_str());
      return kExitInterrupted;
    }
    return ReportError(features.error().WithContext("features"));
  }
  std::printf("features: %lld configs read now (%lld could not be read, reasons in view v_feature_failures; "
              "%lld fully understood)\n",
              static_cast<long long>(features->derived), static_cast<long long>(features->failed),
              static_cast<long long>(features->understood));
  if (features->skipped_changed > 0) {
    std::printf("features: %lld configs changed while being read (a crawl is running?); the next run derives them\n",
                static_cast<long long>(features->skipped_changed));
  }

  selection::SelectOptions options;
  options.k = flags.k;
  options.per_family = flags.per_family;
  options.seed = flags.seed;
  options.store_members = !flags.no_members;
  auto result = selection::RunSelect(**reg, options);
  if (!result) return ReportError(result.error().WithContext("select"));
  const auto& sel = result->selection;
  const auto& c = sel.coverage;
  std::printf("selection %lld%s: %zu representatives of %lld models (%lld distinct; k = %d, seed = %llu)\n",
              static_cast<long long>(result->selection_id),
              result->unchanged ? " (unchanged: the newest stored selection is this one, kept as it is)" : "",
              sel.representatives.size(), static_cast<long long>(c.models), static_cast<long long>(c.distinct_points),
              result->k, static_cast<unsigned long long>(flags.seed));
  if (result->failed_features > 0) {
    std::printf("  left out: %lld models whose config could not be read\n",
                static_cast<long long>(result->failed_features));
    for (const auto& u : result->unreadable) std::printf("    stored features that do not read back: %s\n", u.c_str());
  }
  std::printf("  coarse signatures covered: %lld of %lld (%s)\n", static_cast<long long>(c.coarse_covered),
              static_cast<long long>(c.coarse_total), Percent(c.coarse_covered, c.coarse_total).c_str());
  std::printf("  fine signatures covered:   %lld of %lld (%s)\n", static_cast<long long>(c.fine_covered),
              static_cast<long long>(c.fine_total), Percent(c.fine_covered, c.fine_total).c_str());
  std::printf("  downloads whose model has an equivalent representative: %s\n",
              Percent(c.downloads_equivalent, c.downloads_total).c_str());
  std::printf("  distance to the nearest representative: mean %.4f, max %.4f\n", c.mean_distance, c.max_distance);
  for (const auto& w : sel.warnings) std::printf("warning: %s\n", w.c_str());

  if (flags.show > 0) {
    Table table;
    table.headers = {"rank", "model", "downloads", "stands for", "why"};
    table.numeric = {true, false, true, true, false};
    for (const auto& r : sel.representatives) {
      if (static_cast<int>(table.rows.size()) >= flags.show) break;
      table.rows.push_back({std::to_string(r.rank), std::string(result->population.id(r.model)),
                            std::to_string(result->population.downloads(r.model)), std::to_string(r.stands_for),
                            r.reason});
    }
    std::printf("\n%s", table.RenderAligned(160).c_str());
    if (sel.representatives.size() > table.rows.size()) {
      std::printf("... %zu more: --show %zu, or sqlite3 %s 'SELECT * FROM v_representatives'\n",
                  sel.representatives.size() - table.rows.size(), sel.representatives.size(),
                  global.registry_path.c_str());
    }
  }
  std::printf("registry: %s (tables selections, representatives, selection_members)\n", global.registry_path.c_str());
  return kExitOk;
}

}  // namespace

void AddSelectCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<SelectFlags>();
  CLI::App* cmd = app.add_subcommand(
      "select",
      "Derive architectural features from every crawled config.json (incrementally; interrupt and rerun to go on),\n"
      "then choose K representative models that cover the design space: one per coarse signature first (the\n"
      "most downloaded), then farthest-point k-center. Stores the selection and prints its coverage.");
  auto* k = cmd->add_option("--k", flags->k, "How many representatives")->capture_default_str()->check(CLI::Range(1, 1000000));
  cmd->add_flag("--per-family", flags->per_family,
                "K = the number of families (coarse signatures) in the population: one representative each, the "
                "most downloaded")
      ->excludes(k);
  cmd->add_option("--seed", flags->seed, "Breaks exact ties (same distance, same downloads)")
      ->capture_default_str()
      ->check(SeedCheck())
      ->check(CLI::Range(uint64_t{0}, uint64_t{INT64_MAX}));
  cmd->add_option("--defaults", flags->defaults,
                  "Family defaults and aliases (JSONL) [default: HOME/data/transformers_defaults.jsonl]");
  cmd->add_flag("--no-members", flags->no_members, "Do not store which representative every model maps to");
  cmd->add_option("--show", flags->show, "Representatives to print (0 = none)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  cmd->callback([&global, flags]() { global.exit_code = RunSelectCommand(global, *flags); });
}

}  // namespace coverage::apps

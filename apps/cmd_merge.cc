// `coverage merge`: shard result databases into one registry.
#include <cstdio>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/app.h"
#include "registry/registry.h"

namespace coverage::apps {
namespace {

int Merge(const GlobalOptions& global, const std::vector<std::string>& sources) {
  auto reg = OpenRegistry(global, false, /*create=*/true);
  if (!reg) return ReportError(reg.error());
  registry::MergeSummary total;
  for (const std::string& source : sources) {
    auto s = (*reg)->MergeFrom(source);
    if (!s) return ReportError(s.error());
    std::printf("%s: runs %s; %lld results and %lld model results added, %lld already present, %lld conflicts, "
                "%lld op cases copied, %lld shard records\n",
                source.c_str(), fmt::format("{}", fmt::join(s->runs, ", ")).c_str(),
                static_cast<long long>(s->results_added), static_cast<long long>(s->model_results_added),
                static_cast<long long>(s->already_present), static_cast<long long>(s->conflicts),
                static_cast<long long>(s->cases_added), static_cast<long long>(s->shards_added));
    for (const auto& c : s->conflict_examples) std::printf("  conflict (kept what was here): %s\n", c.c_str());
    total.conflicts += s->conflicts;
    for (auto& r : s->runs) total.runs.push_back(r);
  }
  // Where each merged run stands.
  std::sort(total.runs.begin(), total.runs.end());
  total.runs.erase(std::unique(total.runs.begin(), total.runs.end()), total.runs.end());
  for (const auto& run : total.runs) {
    auto overview = (*reg)->GetRunOverview(run);
    if (!overview || !*overview) continue;
    const registry::RunOverview& o = **overview;
    std::string state = !o.run.finished_at.empty() ? "finished" : "not finished";
    if (o.shard_count > 0) state += fmt::format(" ({} of {} shards finished)", o.shards_finished, o.shard_count);
    std::printf("run %s: %s; %lld results, %lld model results\n", run.c_str(), state.c_str(),
                static_cast<long long>(o.unit_results), static_cast<long long>(o.model_results));
  }
  std::printf("merged into %s\n", global.registry_path.c_str());
  return kExitOk;
}

}  // namespace

void AddMergeCommand(CLI::App& app, GlobalOptions& global) {
  auto sources = std::make_shared<std::vector<std::string>>();
  CLI::App* cmd = app.add_subcommand(
      "merge",
      "Merge the runs of shard registries (run with --shard) into --registry: results are matched by run and case "
      "key; merging the same file twice changes nothing; rows that differ are reported as conflicts and kept as "
      "they were. The registry is created when missing.");
  cmd->add_option("shards", *sources, "Registry files of the shards")->required()->check(CLI::ExistingFile);
  cmd->callback([&global, sources]() { global.exit_code = Merge(global, *sources); });
}

}  // namespace coverage::apps

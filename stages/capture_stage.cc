#include "stages/capture_stage.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

#include "core/progress.h"
#include "registry/registry.h"
#include "runners/capture.h"

namespace coverage::stages {

Result<CaptureStageSummary> RunCaptureStage(registry::Registry& registry, const CaptureStageOptions& options) {
  CaptureStageSummary summary;
  struct Pair {
    const runners::BlockModel* model;
    const runners::CaptureProfile* profile;
  };
  std::vector<Pair> pairs;
  for (const auto& m : options.models) {
    for (const auto& p : options.profiles) {
      if (std::find(p.families.begin(), p.families.end(), m.family) != p.families.end()) pairs.push_back({&m, &p});
    }
  }
  COV_ASSIGN_OR_RETURN(int64_t before, registry.CountCases());
  Progress progress("capture", static_cast<int64_t>(pairs.size()), options.progress);
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (options.stop && options.stop->load()) {
      summary.interrupted = true;
      break;
    }
    const auto& model = *pairs[i].model;
    const auto& profile = *pairs[i].profile;
    progress.Update(static_cast<int64_t>(i), model.id + " / " + profile.name);
    if (!options.force) {
      COV_ASSIGN_OR_RETURN(bool done, registry.HasCapture(model.id, profile.name, kBlocksBuilderVersion));
      if (done) {
        ++summary.pairs_skipped;
        continue;
      }
    }
    const double estimate = runners::EstimateBlockBytes(model, profile);
    if (estimate > options.max_bytes) {
      ++summary.pairs_refused;
      summary.refusals.push_back(fmt::format("{} / {}: needs about {:.3g} GB, over the {:.3g} GB budget (--max-gb)",
                                             model.id, profile.name, estimate / 1e9, options.max_bytes / 1e9));
      continue;
    }
    runners::OpRecorder recorder(runners::CaptureOptions{options.max_depth});
    Status ran = runners::RunBlocks(model, profile, recorder);
    if (!ran.ok()) {
      ++summary.pairs_refused;
      summary.refusals.push_back(fmt::format("{} / {}: {}", model.id, profile.name, ran.message()));
      continue;
    }
    std::vector<runners::CapturedCall> calls = recorder.TakeCalls();
    for (const auto& [why, n] : recorder.skipped()) summary.uncaptured[why] += n;

    int64_t call_count = 0;
    std::unordered_set<std::string> keys;
    COV_RETURN_IF_ERROR(registry.Begin());
    Status s = [&]() -> Status {
      const auto& type = model.config.contains("model_type") ? model.config["model_type"] : nlohmann::json();
      COV_RETURN_IF_ERROR(registry.UpsertModel(
          {model.id, type.is_string() ? type.get<std::string>() : std::string(), model.source, model.config.dump()}));
      // A recapture replaces the pair's provenance instead of adding to it.
      COV_RETURN_IF_ERROR(registry.ClearCaseSources(model.id, profile.name));
      for (const auto& call : calls) {
        COV_ASSIGN_OR_RETURN(int64_t case_id, registry.UpsertCase(call.op_case, {call.flops, call.bytes}));
        registry::CaseSource src;
        src.model_id = model.id;
        src.module_path = call.module_path;
        src.call_site = call.parent_op;
        src.profile = profile.name;
        src.depth = call.depth;
        src.call_count = call.count;
        COV_RETURN_IF_ERROR(registry.AddCaseSource(case_id, src));
        call_count += call.count;
        keys.insert(call.key);
      }
      return registry.RecordCapture(model.id, profile.name, kBlocksBuilderVersion, call_count,
                                    static_cast<int64_t>(keys.size()));
    }();
    if (!s.ok()) {
      registry.Rollback().IgnoreError();
      return s.WithContext("storing the capture of " + model.id + " / " + profile.name);
    }
    COV_RETURN_IF_ERROR(registry.Commit());
    ++summary.pairs_captured;
    summary.calls += call_count;
    summary.cases_seen += static_cast<int64_t>(keys.size());
  }
  progress.Update(static_cast<int64_t>(pairs.size()));
  progress.Finish();
  COV_ASSIGN_OR_RETURN(summary.cases_pruned, registry.PruneOrphanCases());
  COV_ASSIGN_OR_RETURN(summary.cases_total, registry.CountCases());
  summary.cases_new = summary.cases_total - before + summary.cases_pruned;
  return summary;
}

}  // namespace coverage::stages

#include "selection/registry_select.h"

#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>

#include "registry/registry.h"
#include "selection/signature.h"

namespace coverage::selection {

Result<FeatureSummary> DeriveFeatures(registry::Registry& registry, const selection::FamilyDefaults& defaults,
                                      const DeriveOptions& options) {
  FeatureSummary summary;
  std::string after;
  for (;;) {
    if (options.stop && options.stop->load()) {
      return Status::Aborted("stopped after deriving features of " + std::to_string(summary.derived) +
                             " models; run again to go on");
    }
    COV_ASSIGN_OR_RETURN(auto rows,
                         registry.ConfigsNeedingFeatures(selection::kFeatureExtractorVersion, after, options.batch));
    if (rows.empty()) return summary;
    std::vector<registry::FeatureRecord> records(rows.size());
    tbb::parallel_for(size_t{0}, rows.size(), [&](size_t i) {
      registry::FeatureRecord& r = records[i];
      r.model_id = rows[i].model_id;
      r.version = selection::kFeatureExtractorVersion;
      r.derived_from = rows[i].config_json;
      auto f = selection::ExtractFeatures(std::string_view(rows[i].config_json), defaults);
      if (!f) {
        r.ok = false;
        r.reason = f.error().message();
        return;
      }
      r.ok = true;
      r.understood = f->understood;
      r.features_json = selection::ToJson(*f).dump();
      r.coarse = selection::CoarseSignature(*f);
      r.fine = selection::FineSignature(*f);
    });
    COV_ASSIGN_OR_RETURN(const int64_t stored, registry.StoreFeatures(records));
    summary.skipped_changed += static_cast<int64_t>(records.size()) - stored;
    summary.derived += stored;
    for (const auto& r : records) {
      if (!r.ok) ++summary.failed;
      if (r.understood) ++summary.understood;
    }
    after = rows.back().model_id;
    if (options.on_progress) options.on_progress(summary.derived);
  }
}

std::string CoverageJson(const selection::Coverage& c) {
  nlohmann::json j = {{"models", c.models},
                      {"distinct_points", c.distinct_points},
                      {"coarse_total", c.coarse_total},
                      {"coarse_covered", c.coarse_covered},
                      {"fine_total", c.fine_total},
                      {"fine_covered", c.fine_covered},
                      {"downloads_total", c.downloads_total},
                      {"downloads_equivalent", c.downloads_equivalent},
                      {"mean_distance", c.mean_distance},
                      {"max_distance", c.max_distance}};
  return j.dump();
}

Result<SelectSummary> RunSelect(registry::Registry& registry, const SelectOptions& options) {
  if (options.k < 1 && !options.per_family) {
    return Status::InvalidArgument("--k must be at least 1, not " + std::to_string(options.k));
  }
  SelectSummary out;
  std::vector<std::string> ids;
  COV_RETURN_IF_ERROR(registry.ForEachFeature(
      selection::kFeatureExtractorVersion, [&](const registry::FeatureRecord& r) -> Status {
        if (!r.ok) {
          ++out.failed_features;
          return Status::Ok();
        }
        auto j = nlohmann::json::parse(r.features_json, nullptr, /*allow_exceptions=*/false);
        auto f = j.is_discarded() ? Result<selection::Features>(Status::Corruption("not JSON"))
                                  : selection::FeaturesFromJson(j);
        if (!f) {
          // Left out like a config that cannot be read, with the reason on
          // the console; the rest of the selection goes on.
          ++out.failed_features;
          if (out.unreadable.size() < 5) out.unreadable.push_back(r.model_id + ": " + f.error().message());
          return Status::Ok();
        }
        out.population.Add(r.model_id, r.downloads, *f);
        return Status::Ok();
      }));
  if (out.population.size() == 0) {
    return Status::InvalidArgument(
        "no model has usable features: crawl configs first (coverage crawl), then run coverage select");
  }
  out.k = options.per_family ? static_cast<int>(out.population.coarse_signatures()) : options.k;
  COV_ASSIGN_OR_RETURN(out.selection, selection::Select(out.population, out.k, options.seed));

  registry::SelectionRecord record;
  record.k = out.k;
  record.seed = options.seed;
  record.feature_version = selection::kFeatureExtractorVersion;
  record.models = static_cast<int64_t>(out.population.size());
  record.coverage_json = CoverageJson(out.selection.coverage);
  record.warnings_json = nlohmann::json(out.selection.warnings).dump();
  std::vector<registry::RepresentativeRecord> reps;
  for (const auto& r : out.selection.representatives) {
    reps.push_back({r.rank, std::string(out.population.id(r.model)), r.reason, r.distance_when_chosen, r.stands_for,
                    r.downloads_represented});
  }
  std::vector<registry::MemberRecord> members;
  if (options.store_members) {
    members.reserve(out.population.size());
    for (size_t m = 0; m < out.population.size(); ++m) {
      members.push_back({std::string(out.population.id(m)),
                         out.selection.representatives[out.selection.nearest[m]].rank, out.selection.distance[m]});
    }
  }
  COV_ASSIGN_OR_RETURN(out.selection_id, registry.StoreSelection(record, reps, members, &out.unchanged));
  return out;
}

}  // namespace coverage::selection

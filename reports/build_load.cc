// What BuildReport reads: runs and their baselines, case results with their
// provenance, and model results, all through the registry's typed reads
// (registry/reads.cc; no SQL here).
#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "reports/build_parts.h"

namespace coverage::reports::build {

using registry::Registry;

namespace {

RunInfo FromOverview(const registry::RunOverview& o) {
  const registry::RunRecord& r = o.run;
  RunInfo run{r.run_id, r.stage, r.backend, r.started_at, r.finished_at, r.host, r.git_revision, r.libtorch_version,
              r.config_json};
  run.backend_name = r.Identity();
  run.backend_version = r.backend_version;
  run.results = o.unit_results + o.model_results;
  const nlohmann::json config = nlohmann::json::parse(r.config_json, nullptr, false);
  for (const char* judging : {"replay", "checks"}) {
    if (!config.is_object() || !config.contains(judging) || !config[judging].is_object()) continue;
    const nlohmann::json& n = config[judging].value("numerics", nlohmann::json());
    if (n.is_object() && n.contains("declared") && n["declared"].is_string()) {
      run.numerics = n["declared"].get<std::string>();
      if (n.contains("source") && n["source"].is_string() && n["declared"] != "exact fp32") {
        run.numerics += " (" + n["source"].get<std::string>() + ")";
      }
    }
  }
  if (o.shard_count > 0) run.shards = fmt::format("{} of {} shards finished", o.shards_finished, o.shard_count);
  return run;
}

CaseEntry FromRow(const std::string& run_id, registry::CaseResultRow row) {
  CaseEntry c;
  c.run_id = run_id;
  c.key = std::move(row.key);
  c.op = std::move(row.op);
  c.summary = std::move(row.summary);
  c.dtypes = std::move(row.dtypes);
  c.result = std::move(row.result);
  return c;
}

}  // namespace

std::optional<FirstDivergent> ReadFirstDivergent(const nlohmann::json& j) {
  if (!j.is_object()) return std::nullopt;
  const bool located = j.contains("first_divergent") && j["first_divergent"].is_object();
  // A worker that died names the call it was in (Note [Where a worker died]).
  static const nlohmann::json kNone;
  const nlohmann::json& worker = j.contains("worker") && j["worker"].is_object() ? j["worker"] : kNone;
  const bool died = !located && worker.contains("in_call") && worker["in_call"].is_object();
  if (!located && !died) return std::nullopt;
  const auto& d = located ? j["first_divergent"] : worker["in_call"];
  FirstDivergent f;
  f.died_in = died;
  auto text = [&](const char* k) { return d.contains(k) && d[k].is_string() ? d[k].get<std::string>() : ""; };
  auto number = [&](const char* k) -> std::optional<double> {
    if (d.contains(k) && d[k].is_number()) return d[k].get<double>();
    return std::nullopt;
  };
  if (d.contains("call") && d["call"].is_number_integer()) f.call = d["call"].get<int64_t>();
  f.op = text("op");
  f.case_key = text("case_key");
  f.module = text("module");
  f.phase = text("phase");
  f.outcome = text("outcome");
  f.message = text("message");
  f.max_abs_err = number("max_abs_err");
  f.error_ratio = number("error_ratio");
  return f;
}

std::string ReadLocateNote(const nlohmann::json& j) {
  if (!j.is_object()) return "";
  if (auto it = j.find("first_divergent_note"); it != j.end() && it->is_string()) return it->get<std::string>();
  return "";
}

Result<RunInfo> LoadRun(Registry& registry, const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto overview, registry.GetRunOverview(run_id));
  if (!overview) return Status::NotFound("no run '" + run_id + "' in the registry");
  return FromOverview(*overview);
}

// A run's stored configuration minus where it ran (shard, isolation) and the
// paths of its config files (their contents are in the judging options'
// digests): a one-case replay (`--case`), another filter or cost cap is not a
// baseline for a full run. The backend is not a judging option: baselines
// are found on the run's own backend (FindBaseline), and a baseline given on
// another backend is that comparison on purpose; `across_backends` also
// leaves out the numerics each backend declares for itself.
nlohmann::json JudgingOptions(const RunInfo& run, bool across_backends) {
  nlohmann::json j = nlohmann::json::parse(run.config_json, nullptr, false);
  if (!j.is_object()) return nlohmann::json();
  // max_case_gb defaults to the machine's memory: a case it skips shows as
  // skipped, which the diff reports, rather than making runs incomparable.
  for (const char* k : {"shard", "isolation", "tolerances", "profiles", "max_case_gb", "backend"}) j.erase(k);
  if (across_backends) {
    for (const char* judging : {"replay", "checks"}) {
      if (j.contains(judging) && j[judging].is_object()) j[judging].erase("numerics");
    }
  }
  return j;
}

Result<std::pair<std::optional<RunInfo>, std::string>> FindBaseline(Registry& registry, const RunInfo& run) {
  COV_ASSIGN_OR_RETURN(auto earlier, registry.FinishedRunsBefore(run.stage, run.run_id));
  const nlohmann::json judging = JudgingOptions(run, false);
  for (const auto& overview : earlier) {
    RunInfo candidate = FromOverview(overview);
    if (JudgingOptions(candidate, false) == judging) return std::make_pair(std::optional<RunInfo>(candidate), std::string());
  }
  std::string why = "no finished " + run.stage + " run on " + run.backend_name + " started before it";
  if (!earlier.empty()) {
    why = std::to_string(earlier.size()) + " earlier finished " + run.stage + " run(s) on " + run.backend_name +
          " ran other cases or were judged with other options";
  }
  return std::make_pair(std::optional<RunInfo>(), why);
}

Result<CaseMap> LoadCases(Registry& registry, const std::string& run_id) {
  if (run_id.empty()) return CaseMap();
  COV_ASSIGN_OR_RETURN(auto rows, registry.CaseResultsForRun(run_id));
  CaseMap out;
  out.reserve(rows.size());
  for (auto& row : rows) {
    const int64_t id = row.case_id;
    out.emplace(id, FromRow(run_id, std::move(row)));
  }
  return out;
}

// Provenance in one query per kind.
Status AddProvenance(Registry& registry, const std::string& run_id, const std::string& baseline_id, CaseMap& now,
                     CaseMap& removed) {
  COV_ASSIGN_OR_RETURN(auto rows, registry.CaseModelsOfRuns(run_id, baseline_id));
  for (const auto& row : rows) {
    const int64_t id = row.case_id;
    auto it = now.find(id);
    CaseEntry* c = it != now.end() ? &it->second : nullptr;
    if (c == nullptr) {
      auto r = removed.find(id);
      if (r == removed.end()) continue;
      c = &r->second;
    }
    if (c->models.empty() || c->models.back() != row.model_id) c->models.push_back(row.model_id);
    if (!row.model_type.empty()) c->families.push_back(row.model_type);
  }
  COV_ASSIGN_OR_RETURN(auto opinfos, registry.CaseOpInfosOfRuns(run_id, baseline_id));
  for (const auto& [id, name] : opinfos) {
    auto it = now.find(id);
    if (it != now.end()) {
      it->second.opinfos.push_back(name);
    } else if (auto r = removed.find(id); r != removed.end()) {
      r->second.opinfos.push_back(name);
    }
  }
  auto tidy = [](CaseEntry& c) {
    std::sort(c.families.begin(), c.families.end());
    c.families.erase(std::unique(c.families.begin(), c.families.end()), c.families.end());
  };
  for (auto& [id, c] : now) tidy(c);
  for (auto& [id, c] : removed) tidy(c);
  return Status::Ok();
}

Result<ItemMap> LoadItems(Registry& registry, const std::string& run_id, std::vector<ItemKey>* order,
                          std::map<std::string, std::string>* families) {
  COV_ASSIGN_OR_RETURN(auto rows, registry.ModelResultsForRun(run_id, /*as_stored=*/true));
  ItemMap out;
  for (auto& r : rows) {
    ItemKey key{r.model_id, r.stage, r.result.item};
    if (order) order->push_back(key);
    if (families && !r.family.empty()) families->emplace(r.model_id, r.family);
    out.emplace(std::move(key), std::move(r));
  }
  return out;
}

}  // namespace coverage::reports::build

// ReportToJson: the machine-readable summary of a Report, for CI and
// dashboards. The full per-case detail is in the HTML report and the registry.
#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "core/outcome.h"
#include "reports/report.h"

namespace coverage::reports {
namespace {

using nlohmann::json;

json RunToJson(const RunInfo& run) {
  json j = {{"run_id", run.run_id},
            {"stage", run.stage},
            {"backend", run.backend},
            {"backend_name", run.backend_name},
            {"backend_version", run.backend_version},
            {"started_at", run.started_at},
            {"finished_at", run.finished_at},
            {"host", run.host},
            {"git_revision", run.git_revision},
            {"libtorch_version", run.libtorch_version},
            {"numerics", run.numerics},
            {"results", run.results}};
  if (!run.shards.empty()) j["shards"] = run.shards;
  return j;
}

json Optional(const std::optional<double>& v) { return v ? DoubleToJson(*v) : json(); }

}  // namespace

std::string ReportToJson(const Report& report) {
  json j;
  j["title"] = report.title;
  j["generated_at"] = report.generated_at;
  j["registry"] = report.registry_path;
  j["regressed"] = report.Regressed();
  j["runs"] = json::array();
  for (const auto& run : report.runs) j["runs"].push_back(RunToJson(run));
  j["baselines"] = json::array();
  for (const auto& run : report.baselines) j["baselines"].push_back(RunToJson(run));

  j["stages"] = json::array();
  for (const auto& s : report.stages) {
    json verdicts = json::object();
    for (const auto& [verdict, n] : s.verdicts) verdicts[std::string(OutcomeName(verdict))] = n;
    json stage = {{"stage", s.stage}, {"total", s.total}, {"pass_rate", DoubleToJson(s.pass_rate)},
                  {"verdicts", std::move(verdicts)}};
    if (!s.by_source.empty()) {
      json sources = json::object();
      for (const auto& [source, counts] : s.by_source) {
        json v = json::object();
        for (const auto& [verdict, n] : counts) v[std::string(OutcomeName(verdict))] = n;
        sources[source] = std::move(v);
      }
      stage["sources"] = std::move(sources);
    }
    j["stages"].push_back(std::move(stage));
  }
  j["changes"] = json::object();
  for (const auto& [change, n] : report.changes) j["changes"][std::string(ChangeName(change))] = n;

  j["regressions"] = json::array();
  for (const auto& c : report.cases) {
    if (!IsRegression(c.change)) continue;
    const CaseResult& r = c.ResultOrEmpty();
    j["regressions"].push_back({{"run_id", c.run_id},
                                {"key", c.key},
                                {"op", c.op},
                                {"summary", c.summary},
                                {"change", ChangeName(c.change)},
                                {"detail", c.change_detail},
                                {"extra_changes", c.extra_changes},
                                {"verdict", OutcomeNameOrEmpty(c.verdict)},
                                {"baseline_outcome", OutcomeNameOrEmpty(OutcomeOf(c.baseline))},
                                {"max_abs_err", Optional(r.max_abs_err)},
                                {"warm_us", Optional(r.warm_us)},
                                {"repro", c.repro}});
  }
  j["model_regressions"] = json::array();
  for (const auto& m : report.models) {
    for (const auto& item : m.items) {
      if (!IsRegression(item.change)) continue;
      const registry::ModelResultRecord& record = item.Record();
      j["model_regressions"].push_back({{"run_id", item.result ? item.result->run_id : std::string()},
                                        {"model", m.model_id},
                                        {"stage", record.stage},
                                        {"item", record.result.item},
                                        {"change", ChangeName(item.change)},
                                        {"detail", item.change_detail},
                                        {"verdict", OutcomeNameOrEmpty(item.verdict)},
                                        {"baseline_outcome", OutcomeNameOrEmpty(OutcomeOf(item.baseline))},
                                        {"error", record.result.error}});
    }
  }

  const PipelineInfo& p = report.pipeline;
  j["pipeline"] = {{"models_listed", p.models_listed},
                   {"configs_fetched", p.configs_fetched},
                   {"selection_id", p.selection_id},
                   {"representatives", p.representatives},
                   {"families", p.families},
                   {"families_covered", p.families_covered},
                   {"pairs_captured", p.pairs_captured},
                   {"pairs_not_captured", p.pairs_not_captured},
                   {"models_captured", p.models_captured},
                   {"op_cases", p.op_cases}};
  j["broken_ops"] = json::array();
  for (const auto& b : report.broken_ops) {
    json verdicts = json::object();
    for (const auto& [verdict, n] : b.verdicts) verdicts[std::string(OutcomeName(verdict))] = n;
    j["broken_ops"].push_back({{"op", b.op},
                               {"dtypes", b.dtypes},
                               {"cases", b.cases},
                               {"new_failures", b.new_failures},
                               {"verdicts", std::move(verdicts)},
                               {"worst_error_ratio", Optional(b.worst_error_ratio)},
                               {"worst_key", b.worst_key},
                               {"models", b.models}});
  }
  j["lacks"] = json::array();
  for (const auto& s : report.lacks) {
    j["lacks"].push_back({{"op", s.op},
                          {"dtypes", s.dtypes},
                          {"support", s.Support()},
                          {"cases", s.cases},
                          {"unsupported", s.unsupported},
                          {"fallback", s.fallback},
                          {"missing_kernel", s.missing},
                          {"example_key", s.example_key}});
  }
  j["broken_models"] = json::array();
  for (const auto& m : report.broken_models) {
    json divergent = nullptr;
    if (m.first_divergent) {
      const FirstDivergent& d = *m.first_divergent;
      divergent = {{"call", d.call},     {"op", d.op},       {"case_key", d.case_key},
                   {"module", d.module}, {"phase", d.phase}, {"error_ratio", Optional(d.error_ratio)},
                   {"died_in", d.died_in}};
    }
    j["broken_models"].push_back({{"model", m.model_id},
                                  {"family", m.family},
                                  {"stage", m.stage},
                                  {"item", m.item},
                                  {"verdict", OutcomeName(m.verdict)},
                                  {"new", m.is_new},
                                  {"first_divergent", std::move(divergent)},
                                  {"locate_note", m.locate_note},
                                  {"error", m.error}});
  }

  j["blockers"] = json::array();
  for (const auto& b : report.blockers) {
    j["blockers"].push_back({{"key", b.key},
                             {"op", b.op},
                             {"summary", b.summary},
                             {"verdict", OutcomeNameOrEmpty(b.verdict)},
                             {"models", b.models}});
  }
  j["models_failing"] = json::array();
  for (const auto& m : report.models) {
    if (!m.failing) continue;
    json stages = json::object();
    for (const auto& [stage, verdict] : m.stage_verdict) stages[stage] = OutcomeName(verdict);
    j["models_failing"].push_back({{"model", m.model_id},
                                   {"family", m.family},
                                   {"stages", std::move(stages)},
                                   {"failing_cases", m.failing_cases}});
  }
  j["matrix"] = json::object();
  for (const auto& [family, stages] : report.matrix) {
    for (const auto& [stage, cell] : stages) {
      j["matrix"][family][stage] = {{"passing", cell.first}, {"total", cell.second}};
    }
  }
  j["warnings"] = report.warnings;
  return DumpJson(j);
}

}  // namespace coverage::reports

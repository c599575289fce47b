// Typed reads: runs and results as the stages and reports use them, outcomes
// parsed once (Registry::GetRunOverview and the rest, registry.h).
#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {
namespace {

// The outcome in column `col`, or a Corruption naming where it was read.
Result<Outcome> ReadOutcome(const Statement& stmt, int col, const std::string& db, const std::string& table,
                            const std::string& run_id, const std::string& row) {
  const std::string text = stmt.Text(col);
  auto outcome = OutcomeFromName(text);
  if (!outcome) {
    return Status::Corruption(fmt::format("{}: {} of run '{}', {}: unknown outcome '{}'", db, table, run_id, row, text));
  }
  return *outcome;
}

// Columns of `results` from `first` on, in this order.
constexpr const char* kResultColumns =
    "r.case_id, r.outcome, r.error, r.max_abs_err, r.max_rel_err, r.mismatch_frac, r.cosine, r.error_ratio, "
    "r.first_call_us, r.warm_us, r.detail_json, r.attempts, r.flaky, r.attempt_outcomes, r.warm_spread_us, "
    "r.counters_json, r.warm_min_us";

// One result row back into its CaseResult (Note [Stored results] in runs.cc).
Result<StoredResult> ReadResult(const Statement& stmt, int first, const std::string& db, const std::string& run_id) {
  StoredResult stored;
  stored.case_id = stmt.Int(first);
  const std::string row = "case " + std::to_string(stored.case_id);
  auto corrupt = [&](const std::string& what) {
    return Status::Corruption(fmt::format("{}: results of run '{}', {}: {}", db, run_id, row, what));
  };
  CaseResult& r = stored.result;
  COV_ASSIGN_OR_RETURN(r.outcome, ReadOutcome(stmt, first + 1, db, "results", run_id, row));
  r.error = stmt.Text(first + 2);
  r.max_abs_err = stmt.OptionalDouble(first + 3);
  r.max_rel_err = stmt.OptionalDouble(first + 4);
  r.mismatch_frac = stmt.OptionalDouble(first + 5);
  r.cosine = stmt.OptionalDouble(first + 6);
  r.error_ratio = stmt.OptionalDouble(first + 7);
  r.first_call_us = stmt.OptionalDouble(first + 8);
  r.warm_us = stmt.OptionalDouble(first + 9);
  // {"timing": {...}, "replay": <detail>}; a row of another shape keeps its text as the detail.
  r.detail_json = stmt.Text(first + 10);
  const nlohmann::json detail = nlohmann::json::parse(r.detail_json, nullptr, false);
  if (detail.is_object() && detail.contains("replay") && detail.contains("timing") && detail["timing"].is_object()) {
    const nlohmann::json& t = detail["timing"];
    auto number = [&](const char* key) { return t.contains(key) && t[key].is_number() ? t[key].get<double>() : 0.0; };
    r.timing = {number("materialize_us"), number("golden_us"), number("reference_us"),
                number("backend_us"),     number("compare_us"), number("total_us")};
    r.detail_json = detail["replay"].is_null() ? "" : detail["replay"].dump();
  }
  r.attempts = static_cast<int>(stmt.Int(first + 11));
  r.flaky = stmt.Int(first + 12) != 0;
  if (Status s = r.SetAttemptOutcomesText(stmt.Text(first + 13)); !s.ok()) return corrupt(s.message());
  r.warm_spread_us = stmt.OptionalDouble(first + 14);
  if (Status s = r.SetCountersText(stmt.Text(first + 15)); !s.ok()) return corrupt(s.message());
  r.warm_min_us = stmt.OptionalDouble(first + 16);
  return stored;
}

constexpr const char* kRunOverview =
    "SELECT r.run_id, r.stage, r.backend, r.started_at, COALESCE(r.finished_at, ''), COALESCE(r.libtorch_version, ''), "
    "COALESCE(r.host, ''), COALESCE(r.git_revision, ''), COALESCE(r.config_json, ''), "
    "COALESCE(r.backend_name, ''), COALESCE(r.backend_version, ''), "
    "(SELECT COUNT(*) FROM results x WHERE x.run_id = r.run_id), "
    "(SELECT COUNT(*) FROM model_results x WHERE x.run_id = r.run_id), "
    "COALESCE((SELECT MAX(shard_count) FROM run_shards s WHERE s.run_id = r.run_id), 0), "
    "(SELECT COUNT(*) FROM run_shards s WHERE s.run_id = r.run_id AND COALESCE(s.finished_at, '') <> '') "
    "FROM runs r ";

RunRecord ReadRun(const Statement& stmt) {
  RunRecord r;
  r.run_id = stmt.Text(0);
  r.stage = stmt.Text(1);
  r.backend = stmt.Text(2);
  r.started_at = stmt.Text(3);
  r.finished_at = stmt.Text(4);
  r.libtorch_version = stmt.Text(5);
  r.host = stmt.Text(6);
  r.git_revision = stmt.Text(7);
  r.config_json = stmt.Text(8);
  r.backend_name = stmt.Text(9);
  r.backend_version = stmt.Text(10);
  return r;
}

// Columns 0-10 as ReadRun reads them, then the counts.
RunOverview ReadOverview(const Statement& stmt) {
  RunOverview o;
  o.run = ReadRun(stmt);
  o.unit_results = stmt.Int(11);
  o.model_results = stmt.Int(12);
  o.shard_count = stmt.Int(13);
  o.shards_finished = stmt.Int(14);
  return o;
}

}  // namespace

Result<std::vector<StoredResult>> Registry::ResultsForRun(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(std::string("SELECT ") + kResultColumns +
                                               " FROM results r WHERE r.run_id = ?1 ORDER BY r.case_id"));
  stmt.Bind(1, run_id);
  std::vector<StoredResult> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    COV_ASSIGN_OR_RETURN(StoredResult r, ReadResult(stmt, 0, db_->path(), run_id));
    out.push_back(std::move(r));
  }
  return out;
}

Result<std::vector<CaseResultRow>> Registry::CaseResultsForRun(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(
      auto stmt,
      db_->Prepare(std::string("SELECT c.key, c.op || CASE WHEN c.overload = '' THEN '' ELSE '.' || c.overload END, "
                               "c.summary, TRIM(c.dtypes), ") +
                   kResultColumns + " FROM results r JOIN op_cases c ON c.case_id = r.case_id WHERE r.run_id = ?1"));
  stmt.Bind(1, run_id);
  std::vector<CaseResultRow> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    CaseResultRow c{stmt.Text(0), stmt.Text(1), stmt.Text(2), stmt.Text(3), 0, {}};
    COV_ASSIGN_OR_RETURN(StoredResult stored, ReadResult(stmt, 4, db_->path(), run_id));
    c.case_id = stored.case_id;
    c.result = std::move(stored.result);
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::vector<ModelResultRecord>> Registry::ModelResultsForRun(const std::string& run_id, bool as_stored) {
  COV_ASSIGN_OR_RETURN(
      auto stmt,
      db_->Prepare(std::string("SELECT model_id, profile, stage, item, outcome, error, blocked_by, family, max_abs_err, "
                               "max_rel_err, cosine, error_ratio, seconds, detail_json, attempts, flaky, "
                               "attempt_outcomes FROM model_results WHERE run_id = ?1 ORDER BY ") +
                   (as_stored ? "rowid"
                              : "model_id, profile, CASE stage WHEN 'module' THEN 0 WHEN 'model' THEN 1 ELSE 2 END, "
                                "item")));
  stmt.Bind(1, run_id);
  std::vector<ModelResultRecord> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    ModelResultRecord record;
    ModelItemResult& r = record.result;
    record.run_id = run_id;
    record.model_id = stmt.Text(0);
    record.profile = stmt.Text(1);
    record.stage = stmt.Text(2);
    r.item = stmt.Text(3);
    const std::string where = fmt::format("{} {} {}", record.model_id, record.stage, r.item);
    COV_ASSIGN_OR_RETURN(r.outcome, ReadOutcome(stmt, 4, db_->path(), "model_results", run_id, where));
    r.error = stmt.Text(5);
    record.blocked_by = stmt.Text(6);
    record.family = stmt.Text(7);
    r.max_abs_err = stmt.OptionalDouble(8);
    r.max_rel_err = stmt.OptionalDouble(9);
    r.cosine = stmt.OptionalDouble(10);
    r.error_ratio = stmt.OptionalDouble(11);
    r.seconds = stmt.Double(12);
    const std::string detail = stmt.Text(13);
    r.detail = detail.empty() ? nlohmann::json::object() : nlohmann::json::parse(detail, nullptr, false);
    if (!r.detail.is_object()) {
      return Status::Corruption(fmt::format("{}: model_results of run {}, {}: detail_json is not a JSON object",
                                            db_->path(), run_id, where));
    }
    r.attempts = static_cast<int>(stmt.Int(14));
    r.flaky = stmt.Int(15) != 0;
    COV_RETURN_IF_ERROR(r.SetAttemptOutcomesText(stmt.Text(16)).WithContext(
        fmt::format("{}: model_results of run {}, {}", db_->path(), run_id, where)));
    out.push_back(std::move(record));
  }
  return out;
}

Result<std::optional<RunRecord>> Registry::GetRun(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT run_id, stage, backend, started_at, finished_at, libtorch_version, host, git_revision, config_json, "
      "COALESCE(backend_name, ''), COALESCE(backend_version, '') FROM runs WHERE run_id = ?1"));
  stmt.Bind(1, run_id);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<RunRecord>();
  return std::optional<RunRecord>(ReadRun(stmt));
}

Result<std::optional<RunOverview>> Registry::GetRunOverview(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(std::string(kRunOverview) + "WHERE r.run_id = ?1"));
  stmt.Bind(1, run_id);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<RunOverview>();
  return std::optional<RunOverview>(ReadOverview(stmt));
}

// Note [Run order]
// Runs are ordered by seq, the order in which this registry recorded them
// (schema v11: a trigger numbers every new row). It is unique, so no two
// runs are ever unordered, and it follows the order the runs were started
// in this registry, whatever the wall clock did: started_at is UTC to the
// millisecond, for people, but two nightlies can start in one second (or
// millisecond), and a clock can be set back. A baseline is the newest
// finished run before the reported one in this order. A run merged from
// another registry takes the next seq here, when it is merged (runs merged
// from one file keep their order there).
Result<std::vector<RunOverview>> Registry::FinishedRunsBefore(const std::string& stage, const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(std::string(kRunOverview) +
                                               "JOIN runs me ON me.run_id = ?2 "
                                               "WHERE r.stage = ?1 AND COALESCE(NULLIF(r.backend_name, ''), r.backend) "
                                               "= COALESCE(NULLIF(me.backend_name, ''), me.backend) AND "
                                               "COALESCE(r.finished_at, '') <> '' AND r.seq < me.seq "
                                               "ORDER BY r.seq DESC"));
  stmt.Bind(1, stage).Bind(2, run_id);
  std::vector<RunOverview> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back(ReadOverview(stmt));
  }
  return out;
}

Result<std::vector<CaseModelRow>> Registry::CaseModelsOfRuns(const std::string& run_id,
                                                            const std::string& other_run_id) {
  COV_ASSIGN_OR_RETURN(
      auto stmt, db_->Prepare("SELECT DISTINCT s.case_id, s.model_id, COALESCE(m.model_type, '') FROM case_sources s "
                              "LEFT JOIN models m ON m.id = s.model_id "
                              "WHERE s.case_id IN (SELECT case_id FROM results WHERE run_id = ?1 OR run_id = ?2) "
                              "ORDER BY s.case_id, s.model_id"));
  stmt.Bind(1, run_id).Bind(2, other_run_id);
  std::vector<CaseModelRow> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back({stmt.Int(0), stmt.Text(1), stmt.Text(2)});
  }
  return out;
}

Result<std::vector<std::pair<int64_t, std::string>>> Registry::CaseOpInfosOfRuns(const std::string& run_id,
                                                                                const std::string& other_run_id) {
  COV_ASSIGN_OR_RETURN(
      auto stmt, db_->Prepare("SELECT DISTINCT o.case_id, o.opinfo || CASE WHEN o.variant = '' THEN '' ELSE '.' || "
                              "o.variant END AS name FROM opinfo_samples o "
                              "WHERE o.case_id IN (SELECT case_id FROM results WHERE run_id = ?1 OR run_id = ?2) "
                              "ORDER BY o.case_id, name"));
  stmt.Bind(1, run_id).Bind(2, other_run_id);
  std::vector<std::pair<int64_t, std::string>> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.emplace_back(stmt.Int(0), stmt.Text(1));
  }
  return out;
}

Result<std::map<std::string, std::string>> Registry::ModelTypes(const std::vector<std::string>& model_ids) {
  std::map<std::string, std::string> out;
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT COALESCE(model_type, '') FROM models WHERE id = ?1"));
  for (const auto& id : model_ids) {
    COV_RETURN_IF_ERROR(stmt.Reset());
    stmt.Bind(1, id);
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (row && !stmt.Text(0).empty()) out[id] = stmt.Text(0);
  }
  return out;
}

Result<std::optional<std::string>> Registry::LatestRunId() {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT run_id FROM runs ORDER BY seq DESC LIMIT 1"));
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(stmt.Text(0));
}

Result<PipelineCounts> Registry::GetPipelineCounts() {
  PipelineCounts out;
  auto count = [&](const char* sql, int64_t* into) -> Status {
    COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(sql));
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (row) *into = stmt.Int(0);
    return Status::Ok();
  };
  COV_RETURN_IF_ERROR(count("SELECT COUNT(*) FROM crawls", &out.crawls));
  COV_RETURN_IF_ERROR(count("SELECT COUNT(*) FROM models", &out.models));
  COV_RETURN_IF_ERROR(count("SELECT COUNT(*) FROM models WHERE config_status = 'fetched'", &out.configs_fetched));
  COV_RETURN_IF_ERROR(count("SELECT COUNT(*) FROM op_cases", &out.op_cases));
  COV_RETURN_IF_ERROR(count("SELECT COUNT(DISTINCT model_id) FROM programs WHERE status = 'captured'",
                            &out.models_captured));
  {
    COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT status, COUNT(*) FROM programs GROUP BY status"));
    for (;;) {
      COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
      if (!row) break;
      out.program_statuses[stmt.Text(0)] = stmt.Int(1);
    }
  }
  COV_ASSIGN_OR_RETURN(auto sel, db_->Prepare("SELECT selection_id, k, models, coverage_json FROM selections "
                                              "ORDER BY selection_id DESC LIMIT 1"));
  COV_ASSIGN_OR_RETURN(bool has_selection, sel.Step());
  if (has_selection) {
    out.selection_id = sel.Int(0);
    out.selection_k = sel.Int(1);
    out.selection_models = sel.Int(2);
    auto coverage = nlohmann::json::parse(sel.Text(3), nullptr, /*allow_exceptions=*/false);
    if (coverage.is_object()) {
      out.coarse_total = coverage.value("coarse_total", int64_t{0});
      out.coarse_covered = coverage.value("coarse_covered", int64_t{0});
    }
    COV_ASSIGN_OR_RETURN(auto reps, db_->Prepare("SELECT COUNT(*) FROM representatives WHERE selection_id = ?1"));
    reps.Bind(1, out.selection_id);
    COV_ASSIGN_OR_RETURN(bool row, reps.Step());
    if (row) out.representatives = reps.Int(0);
  }
  return out;
}

Result<std::vector<CaseSourceRow>> Registry::SourcesOfCase(const std::string& key, int64_t limit) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT s.model_id, s.module_path, s.profile, s.call_count "
                                               "FROM case_sources s JOIN op_cases c ON c.case_id = s.case_id "
                                               "WHERE c.key = ?1 ORDER BY s.call_count DESC, s.model_id LIMIT ?2"));
  stmt.Bind(1, key).Bind(2, limit);
  std::vector<CaseSourceRow> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back({stmt.Text(0), stmt.Text(1), stmt.Text(2), stmt.Int(3)});
  }
  return out;
}

Result<std::vector<CaseRunResult>> Registry::ResultsOfCase(const std::string& key, int64_t limit) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT r.run_id, u.backend, r.outcome, COALESCE(r.error, '') "
                                               "FROM results r JOIN op_cases c ON c.case_id = r.case_id "
                                               "JOIN runs u ON u.run_id = r.run_id WHERE c.key = ?1 "
                                               "ORDER BY u.seq DESC LIMIT ?2"));
  stmt.Bind(1, key).Bind(2, limit);
  std::vector<CaseRunResult> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    CaseRunResult r{stmt.Text(0), stmt.Text(1), Outcome::kPass, stmt.Text(3)};
    COV_ASSIGN_OR_RETURN(r.outcome, ReadOutcome(stmt, 2, db_->path(), "results", r.run_id, "case " + key));
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace coverage::registry

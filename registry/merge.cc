// Registry::MergeFrom: shard result databases into one registry.
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {
namespace {

// What must agree for two pieces of one run to be one run: everything in
// the stored configuration except where the piece ran (its shard).
// Paths of config files may differ between machines; their contents are
// compared through the digests the run stores ("replay", "checks").
nlohmann::json Comparable(const std::string& config_json) {
  nlohmann::json j = nlohmann::json::parse(config_json, nullptr, false);
  if (!j.is_object()) return config_json;
  for (const char* k : {"shard", "tolerances", "profiles", "isolation"}) j.erase(k);
  return j;
}

Result<int64_t> CountOf(Database& db, const std::string& sql) {
  COV_ASSIGN_OR_RETURN(auto stmt, db.Prepare(sql));
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  return row ? stmt.Int(0) : 0;
}

// The judgement of a result: rows equal in these are the same result
// (timings and when it was recorded may differ).
constexpr const char* kSameResult =
    "m.outcome IS s.outcome AND m.error IS s.error AND m.max_abs_err IS s.max_abs_err AND "
    "m.max_rel_err IS s.max_rel_err AND m.mismatch_frac IS s.mismatch_frac AND m.cosine IS s.cosine AND "
    "m.error_ratio IS s.error_ratio";
constexpr const char* kSameModelResult =
    "m.outcome IS s.outcome AND m.error IS s.error AND m.blocked_by IS s.blocked_by AND "
    "m.max_abs_err IS s.max_abs_err AND m.max_rel_err IS s.max_rel_err AND m.cosine IS s.cosine AND "
    "m.error_ratio IS s.error_ratio";

}  // namespace

Result<MergeSummary> Registry::MergeFrom(const std::string& source_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(source_path, ec)) {
    return Status::NotFound("cannot merge '" + source_path + "': no such file");
  }
  if (std::filesystem::equivalent(source_path, db_->path(), ec)) {
    return Status::InvalidArgument("cannot merge '" + source_path + "' into itself");
  }
  // The source is only read. One of an older schema is migrated in a
  // temporary copy; a newer or foreign database is refused.
  std::string attach_path = source_path;
  std::filesystem::path migrated;
  {
    auto source = Registry::Open(source_path, {.read_only = true});
    if (!source && source.error().message().find("needs migrating") != std::string::npos) {
      migrated = std::filesystem::temp_directory_path() /
                 ("coverage-merge-" + std::to_string(::getpid()) + "-" + std::filesystem::path(source_path).filename().string());
      std::filesystem::copy_file(source_path, migrated, std::filesystem::copy_options::overwrite_existing, ec);
      if (ec) return Status::IoError("cannot copy '" + source_path + "' to migrate it: " + ec.message());
      source = Registry::Open(migrated.string());
      attach_path = migrated.string();
    }
    if (!source) return source.error().WithContext("merging '" + source_path + "'");
    // Every row the merge copies is read first as this registry reads its
    // own (outcomes, cases, details): a shard that cannot be read whole is
    // refused whole, naming the file, table and row, before anything is
    // written (before, a result of outcome 'banana' merged, and the
    // report then failed on it).
    const auto refuse = [&](const Status& why) {
      return Status::Corruption("cannot merge '" + source_path + "': " + why.message() + "; nothing was merged");
    };
    auto run_ids = (*source)->Query("SELECT run_id FROM runs ORDER BY run_id");
    if (!run_ids) return refuse(run_ids.error());
    for (const auto& row : run_ids->rows) {
      if (auto r = (*source)->ResultsForRun(row[0]); !r) return refuse(r.error());
      if (auto m = (*source)->ModelResultsForRun(row[0], /*as_stored=*/true); !m) return refuse(m.error());
    }
    if (auto cases = (*source)->FindCases({}); !cases) return refuse(cases.error());
  }
  struct RemoveCopy {
    std::filesystem::path p;
    ~RemoveCopy() {
      std::error_code ignored;
      if (!p.empty()) std::filesystem::remove(p, ignored);
    }
  } remove_copy{migrated};
  COV_ASSIGN_OR_RETURN(auto attach, db_->Prepare("ATTACH DATABASE ?1 AS src"));
  attach.Bind(1, attach_path);
  COV_RETURN_IF_ERROR(attach.Run().WithContext("attaching '" + source_path + "'"));
  MergeSummary summary;
  Status s = InTransaction(*db_, [&]() -> Status {
    // Runs: new ones are copied; ones present must be the same run.
    COV_ASSIGN_OR_RETURN(auto runs, db_->Prepare(
        "SELECT s.run_id, s.stage, s.backend, s.config_json, m.stage, m.backend, m.config_json, m.run_id IS NULL "
        "FROM src.runs s LEFT JOIN main.runs m ON m.run_id = s.run_id ORDER BY s.run_id"));
    for (;;) {
      COV_ASSIGN_OR_RETURN(bool row, runs.Step());
      if (!row) break;
      summary.runs.push_back(runs.Text(0));
      if (runs.Int(7) != 0) {
        ++summary.runs_added;
        continue;
      }
      if (runs.Text(1) != runs.Text(4) || runs.Text(2) != runs.Text(5) ||
          Comparable(runs.Text(3)) != Comparable(runs.Text(6))) {
        return Status::InvalidArgument(
            "run '" + runs.Text(0) + "' in '" + source_path + "' (stage " + runs.Text(1) + ", backend " +
            runs.Text(2) + ", options " + runs.Text(3) + ") is not the run of that id here (stage " + runs.Text(4) +
            ", backend " + runs.Text(5) + ", options " + runs.Text(6) + "); nothing was merged");
      }
    }
    COV_RETURN_IF_ERROR(db_->Exec(
        "INSERT OR IGNORE INTO main.runs(run_id, stage, backend, started_at, finished_at, libtorch_version, host, "
        "git_revision, config_json, backend_name, backend_version) SELECT run_id, stage, backend, started_at, NULL, "
        "libtorch_version, host, git_revision, config_json, backend_name, backend_version FROM src.runs ORDER BY seq"));
    // An earlier start wins.
    COV_RETURN_IF_ERROR(db_->Exec(
        "UPDATE main.runs SET started_at = (SELECT s.started_at FROM src.runs s WHERE s.run_id = main.runs.run_id) "
        "WHERE run_id IN (SELECT run_id FROM src.runs s WHERE s.started_at < main.runs.started_at)"));

    // Op cases the source ran that this registry lacks (matched by key).
    COV_RETURN_IF_ERROR(db_->Exec(
        "INSERT INTO main.op_cases(key, op, overload, case_json, case_version, dtypes, summary, flops, bytes, "
        "added_at) SELECT c.key, c.op, c.overload, c.case_json, c.case_version, c.dtypes, c.summary, c.flops, "
        "c.bytes, c.added_at FROM src.op_cases c WHERE c.case_id IN (SELECT case_id FROM src.results) "
        "AND c.key NOT IN (SELECT key FROM main.op_cases)"));
    summary.cases_added = db_->Changes();

    // Results, matched by (run, case key).
    const std::string joined =
        " FROM src.results s JOIN src.op_cases sc ON sc.case_id = s.case_id "
        "JOIN main.op_cases mc ON mc.key = sc.key ";
    // A result stored as skipped (a cost cap, say) is retried by a resume:
    // a shard's later, real result replaces it.
    COV_RETURN_IF_ERROR(db_->Exec(
        "DELETE FROM main.results WHERE outcome = 'skipped' AND EXISTS (SELECT 1" + joined +
        "WHERE s.run_id = main.results.run_id AND mc.case_id = main.results.case_id AND s.outcome != 'skipped')"));
    const std::string existing = joined + "JOIN main.results m ON m.run_id = s.run_id AND m.case_id = mc.case_id ";
    COV_ASSIGN_OR_RETURN(summary.already_present,
                         CountOf(*db_, "SELECT COUNT(*)" + existing + "WHERE " + kSameResult));
    COV_ASSIGN_OR_RETURN(int64_t result_conflicts,
                         CountOf(*db_, "SELECT COUNT(*)" + existing + "WHERE NOT (" + kSameResult + ")"));
    summary.conflicts += result_conflicts;
    if (result_conflicts > 0) {
      COV_ASSIGN_OR_RETURN(auto ex, db_->Prepare(
          "SELECT s.run_id, sc.key, m.outcome, s.outcome" + existing + "WHERE NOT (" + kSameResult + ") LIMIT 10"));
      for (;;) {
        COV_ASSIGN_OR_RETURN(bool row, ex.Step());
        if (!row) break;
        summary.conflict_examples.push_back("run " + ex.Text(0) + " case " + ex.Text(1) + ": here " + ex.Text(2) +
                                            ", in the source " + ex.Text(3));
      }
    }
    COV_RETURN_IF_ERROR(db_->Exec(
        "INSERT OR IGNORE INTO main.results(run_id, case_id, outcome, error, max_abs_err, max_rel_err, "
        "mismatch_frac, cosine, error_ratio, first_call_us, warm_us, detail_json, recorded_at, attempts, flaky, "
        "attempt_outcomes, warm_spread_us, counters_json, warm_min_us) SELECT s.run_id, mc.case_id, s.outcome, "
        "s.error, s.max_abs_err, s.max_rel_err, s.mismatch_frac, s.cosine, s.error_ratio, s.first_call_us, "
        "s.warm_us, s.detail_json, s.recorded_at, s.attempts, s.flaky, s.attempt_outcomes, s.warm_spread_us, "
        "s.counters_json, s.warm_min_us" +
        joined));
    summary.results_added = db_->Changes();

    // Model results, matched by their key. A (model, stage) stored only as
    // skipped here is replaced whole by the source's real result (a stage
    // is one set of rows, see RecordModelStage).
    COV_RETURN_IF_ERROR(db_->Exec(
        "DELETE FROM main.model_results WHERE EXISTS (SELECT 1 FROM src.model_results s WHERE "
        "s.run_id = main.model_results.run_id AND s.model_id = main.model_results.model_id AND "
        "s.stage = main.model_results.stage AND s.outcome != 'skipped') AND NOT EXISTS (SELECT 1 FROM "
        "main.model_results o WHERE o.run_id = main.model_results.run_id AND o.model_id = main.model_results.model_id "
        "AND o.stage = main.model_results.stage AND o.outcome != 'skipped')"));
    const std::string model_existing =
        " FROM src.model_results s JOIN main.model_results m ON m.run_id = s.run_id AND m.model_id = s.model_id "
        "AND m.profile = s.profile AND m.stage = s.stage AND m.item = s.item ";
    COV_ASSIGN_OR_RETURN(int64_t model_same,
                         CountOf(*db_, "SELECT COUNT(*)" + model_existing + "WHERE " + kSameModelResult));
    COV_ASSIGN_OR_RETURN(int64_t model_conflicts,
                         CountOf(*db_, "SELECT COUNT(*)" + model_existing + "WHERE NOT (" + kSameModelResult + ")"));
    summary.already_present += model_same;
    summary.conflicts += model_conflicts;
    if (model_conflicts > 0) {
      COV_ASSIGN_OR_RETURN(auto ex, db_->Prepare(
          "SELECT s.run_id, s.model_id, s.stage, s.item, m.outcome, s.outcome" + model_existing + "WHERE NOT (" +
          kSameModelResult + ") LIMIT 10"));
      for (;;) {
        COV_ASSIGN_OR_RETURN(bool row, ex.Step());
        if (!row) break;
        if (summary.conflict_examples.size() >= 10) break;
        summary.conflict_examples.push_back("run " + ex.Text(0) + " " + ex.Text(2) + " " + ex.Text(1) + " " +
                                            ex.Text(3) + ": here " + ex.Text(4) + ", in the source " + ex.Text(5));
      }
    }
    COV_RETURN_IF_ERROR(db_->Exec(
        "INSERT OR IGNORE INTO main.model_results(run_id, model_id, profile, stage, item, outcome, error, "
        "blocked_by, family, max_abs_err, max_rel_err, cosine, error_ratio, seconds, detail_json, recorded_at, "
        "attempts, flaky, attempt_outcomes) SELECT run_id, model_id, profile, stage, item, outcome, error, "
        "blocked_by, family, max_abs_err, max_rel_err, cosine, error_ratio, seconds, detail_json, recorded_at, "
        "attempts, flaky, attempt_outcomes FROM src.model_results"));
    summary.model_results_added = db_->Changes();

    // Shards, and when a run is complete.
    COV_RETURN_IF_ERROR(db_->Exec(
        "INSERT OR IGNORE INTO main.run_shards(run_id, shard_index, shard_count, host, started_at, finished_at) "
        "SELECT run_id, shard_index, shard_count, host, started_at, finished_at FROM src.run_shards"));
    summary.shards_added = db_->Changes();
    COV_RETURN_IF_ERROR(db_->Exec(
        "UPDATE main.run_shards SET finished_at = (SELECT s.finished_at FROM src.run_shards s WHERE "
        "s.run_id = main.run_shards.run_id AND s.shard_index = main.run_shards.shard_index AND "
        "s.shard_count = main.run_shards.shard_count) WHERE finished_at IS NULL AND EXISTS (SELECT 1 FROM "
        "src.run_shards s WHERE s.run_id = main.run_shards.run_id AND s.shard_index = main.run_shards.shard_index "
        "AND s.shard_count = main.run_shards.shard_count AND s.finished_at IS NOT NULL)"));
    // An unsharded run finished in the source is finished here.
    COV_RETURN_IF_ERROR(db_->Exec(
        "UPDATE main.runs SET finished_at = (SELECT s.finished_at FROM src.runs s WHERE s.run_id = main.runs.run_id) "
        "WHERE finished_at IS NULL AND run_id IN (SELECT run_id FROM src.runs WHERE finished_at IS NOT NULL) "
        "AND run_id NOT IN (SELECT run_id FROM main.run_shards)"));
    // A sharded run is finished when shards 0..N-1 of one N all are.
    COV_RETURN_IF_ERROR(db_->Exec(
        "UPDATE main.runs SET finished_at = (SELECT MAX(finished_at) FROM main.run_shards r WHERE "
        "r.run_id = main.runs.run_id) WHERE finished_at IS NULL AND run_id IN (SELECT run_id FROM main.run_shards "
        "GROUP BY run_id, shard_count HAVING COUNT(DISTINCT CASE WHEN finished_at IS NOT NULL THEN shard_index END) "
        "= shard_count)"));
    return Status::Ok();
  });
  Status detach = db_->Exec("DETACH DATABASE src");
  if (!s.ok()) return s.WithContext("merging '" + source_path + "'");
  COV_RETURN_IF_ERROR(detach);
  return summary;
}

}  // namespace coverage::registry

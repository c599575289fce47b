// Registry: what the test stages store (runs, results, shards, leases,
// in-flight marks, model stage results). See registry.h.
#include <string>

#include <fmt/format.h>

#include "core/json_double.h"
#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {

Result<RunRecord> Registry::CreateOrResumeRun(const RunRecord& run, bool* resumed) {
  COV_ASSIGN_OR_RETURN(auto existing, GetRun(run.run_id));
  if (existing) {
    if (existing->stage != run.stage || existing->backend != run.backend) {
      return Status::InvalidArgument("run '" + run.run_id + "' exists with stage '" + existing->stage +
                                     "' and backend '" + existing->backend + "'; cannot resume it as stage '" +
                                     run.stage + "' on backend '" + run.backend + "' (choose another --run id)");
    }
    if (resumed) *resumed = true;
    return *existing;
  }
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO runs(run_id, stage, backend, started_at, libtorch_version, host, git_revision, config_json, "
      "backend_name, backend_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, NULLIF(?9, ''), ?10)"));
  stmt.Bind(1, run.run_id).Bind(2, run.stage).Bind(3, run.backend).Bind(4, run.started_at);
  stmt.Bind(5, run.libtorch_version).Bind(6, run.host).Bind(7, run.git_revision).Bind(8, run.config_json);
  stmt.Bind(9, run.backend_name).Bind(10, run.backend_version);
  COV_RETURN_IF_ERROR(stmt.Run());
  if (resumed) *resumed = false;
  return run;
}

Status Registry::FinishRun(const std::string& run_id, const std::string& finished_at) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("UPDATE runs SET finished_at = ?2 WHERE run_id = ?1"));
  stmt.Bind(1, run_id).Bind(2, finished_at);
  return stmt.Run();
}

Result<std::unordered_set<int64_t>> Registry::FinishedCaseIds(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT case_id FROM results WHERE run_id = ?1 AND outcome != 'skipped'"));
  stmt.Bind(1, run_id);
  std::unordered_set<int64_t> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.insert(stmt.Int(0));
  }
  return out;
}

// Note [Stored results]
// ~~~~~~~~~~~~~~~~~~~~~~
// A unit result has one record, CaseResult (core/case_result.h): the
// executor makes it, the worker sends it as a JSON value, and the registry
// binds its fields to the row here and reads them back in reads.cc. The
// columns hold the figures; detail_json holds {"timing": {...}, "replay":
// <the result's own detail>}, the timing breakdown at 0.1 us; counters are a
// JSON object, attempt outcomes "crash,pass". A model item likewise has one
// record, ModelItemResult (core/model_item.h), which ModelResultRecord holds
// with where it belongs; its detail is stored as the JSON object it is, read
// back once.
std::string StoredDetail(const CaseResult& r) {
  return fmt::format(R"({{"timing":{{"materialize_us":{:.1f},"golden_us":{:.1f},"reference_us":{:.1f},)"
                     R"("backend_us":{:.1f},"compare_us":{:.1f},"total_us":{:.1f}}},"replay":{}}})",
                     r.timing.materialize_us, r.timing.golden_us, r.timing.reference_us, r.timing.backend_us,
                     r.timing.compare_us, r.timing.total_us, r.detail_json.empty() ? "null" : r.detail_json);
}

Status Registry::RecordResult(const std::string& run_id, int64_t case_id, const CaseResult& r) {
  const std::string attempt_outcomes = r.AttemptOutcomesText();
  const std::string counters = r.CountersText();
  return InTransaction(*db_, [&]() -> Status {
    COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
        "INSERT INTO results(run_id, case_id, outcome, error, max_abs_err, max_rel_err, mismatch_frac, cosine, "
        "error_ratio, first_call_us, warm_us, detail_json, attempts, flaky, attempt_outcomes, warm_spread_us, "
        "counters_json, warm_min_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, "
        "?17, ?18) "
        "ON CONFLICT(run_id, case_id) DO UPDATE SET outcome = excluded.outcome, error = excluded.error, "
        "max_abs_err = excluded.max_abs_err, max_rel_err = excluded.max_rel_err, "
        "mismatch_frac = excluded.mismatch_frac, cosine = excluded.cosine, error_ratio = excluded.error_ratio, "
        "first_call_us = excluded.first_call_us, warm_us = excluded.warm_us, detail_json = excluded.detail_json, "
        "attempts = excluded.attempts, flaky = excluded.flaky, attempt_outcomes = excluded.attempt_outcomes, "
        "warm_spread_us = excluded.warm_spread_us, counters_json = excluded.counters_json, "
        "warm_min_us = excluded.warm_min_us, "
        "recorded_at = strftime('%Y-%m-%dT%H:%M:%SZ','now')"));
    stmt.Bind(1, run_id).Bind(2, case_id).Bind(3, OutcomeName(r.outcome)).Bind(4, r.error);
    stmt.Bind(5, r.max_abs_err).Bind(6, r.max_rel_err).Bind(7, r.mismatch_frac).Bind(8, r.cosine);
    stmt.Bind(9, r.error_ratio).Bind(10, r.first_call_us).Bind(11, r.warm_us).Bind(12, StoredDetail(r));
    stmt.Bind(13, r.attempts).Bind(14, r.flaky ? 1 : 0);
    if (attempt_outcomes.empty()) stmt.BindNull(15); else stmt.Bind(15, attempt_outcomes);
    stmt.Bind(16, r.warm_spread_us);
    if (counters.empty()) stmt.BindNull(17); else stmt.Bind(17, counters);
    stmt.Bind(18, r.warm_min_us);
    COV_RETURN_IF_ERROR(stmt.Run());
    COV_ASSIGN_OR_RETURN(auto clear, db_->Prepare("DELETE FROM in_flight WHERE run_id = ?1 AND item = ?2"));
    clear.Bind(1, run_id).Bind(2, "case:" + std::to_string(case_id));
    return clear.Run();
  }).WithContext("recording result of case " + std::to_string(case_id) + " in run " + run_id);
}

Status Registry::StartShard(const std::string& run_id, int shard_index, int shard_count, const std::string& host,
                            const std::string& started_at) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO run_shards(run_id, shard_index, shard_count, host, started_at) VALUES (?1, ?2, ?3, ?4, ?5) "
      "ON CONFLICT(run_id, shard_index, shard_count) DO UPDATE SET host = excluded.host, finished_at = NULL"));
  stmt.Bind(1, run_id).Bind(2, shard_index).Bind(3, shard_count).Bind(4, host).Bind(5, started_at);
  return stmt.Run().WithContext("recording shard " + std::to_string(shard_index) + "/" + std::to_string(shard_count) +
                                " of run " + run_id);
}

Status Registry::FinishShard(const std::string& run_id, int shard_index, int shard_count,
                             const std::string& finished_at) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "UPDATE run_shards SET finished_at = ?4 WHERE run_id = ?1 AND shard_index = ?2 AND shard_count = ?3"));
  stmt.Bind(1, run_id).Bind(2, shard_index).Bind(3, shard_count).Bind(4, finished_at);
  return stmt.Run();
}

namespace {

// The holder's own lease row: ?1..?6 of a statement.
constexpr std::string_view kLeaseRow =
    "run_id = ?1 AND shard_index = ?2 AND shard_count = ?3 AND host = ?4 AND pid = ?5 AND process_start = ?6";

void BindLease(Statement& stmt, const RunLease& l) {
  stmt.Bind(1, l.run_id).Bind(2, l.shard_index).Bind(3, l.shard_count).Bind(4, l.host);
  stmt.Bind(5, l.pid).Bind(6, l.process_start);
}

bool LeasesOverlap(const RunLease& a, const RunLease& b) {
  if (a.shard_count == 0 || b.shard_count == 0) return true;  // a whole run overlaps everything
  if (a.shard_count != b.shard_count) return true;            // other splits share keys
  return a.shard_index == b.shard_index;
}

}  // namespace

Result<std::optional<RunLease>> Registry::AcquireRunLease(const RunLease& mine,
                                                          const std::function<bool(const RunLease&)>& is_live,
                                                          std::vector<RunLease>* taken_over) {
  std::optional<RunLease> holder;
  COV_RETURN_IF_ERROR(InTransaction(*db_, [&]() -> Status {
    COV_ASSIGN_OR_RETURN(auto read, db_->Prepare(
        "SELECT shard_index, shard_count, host, pid, process_start, acquired_at, renewed_at, "
        "CAST(strftime('%s','now') AS INTEGER) - CAST(strftime('%s', renewed_at) AS INTEGER) "
        "FROM run_leases WHERE run_id = ?1 ORDER BY shard_count, shard_index"));
    read.Bind(1, mine.run_id);
    std::vector<RunLease> dead;
    for (;;) {
      COV_ASSIGN_OR_RETURN(bool row, read.Step());
      if (!row) break;
      RunLease l;
      l.run_id = mine.run_id;
      l.shard_index = static_cast<int>(read.Int(0));
      l.shard_count = static_cast<int>(read.Int(1));
      l.host = read.Text(2);
      l.pid = read.Int(3);
      l.process_start = read.Int(4);
      l.acquired_at = read.Text(5);
      l.renewed_at = read.Text(6);
      l.age_seconds = read.Int(7);
      if (!LeasesOverlap(l, mine)) continue;
      if (is_live(l)) {
        holder = std::move(l);
        return Status::Ok();
      }
      dead.push_back(std::move(l));
    }
    COV_ASSIGN_OR_RETURN(auto del, db_->Prepare(
        "DELETE FROM run_leases WHERE run_id = ?1 AND shard_index = ?2 AND shard_count = ?3"));
    for (const RunLease& l : dead) {
      COV_RETURN_IF_ERROR(del.Reset());
      del.Bind(1, l.run_id).Bind(2, l.shard_index).Bind(3, l.shard_count);
      COV_RETURN_IF_ERROR(del.Run());
    }
    COV_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO run_leases(run_id, shard_index, shard_count, host, pid, process_start, acquired_at, renewed_at) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, strftime('%Y-%m-%dT%H:%M:%SZ','now'), strftime('%Y-%m-%dT%H:%M:%SZ','now'))"));
    BindLease(ins, mine);
    COV_RETURN_IF_ERROR(ins.Run());
    if (taken_over) taken_over->insert(taken_over->end(), dead.begin(), dead.end());
    return Status::Ok();
  }).WithContext("taking the lease of run " + mine.run_id));
  return holder;
}

Status Registry::RenewRunLease(const RunLease& mine) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "UPDATE run_leases SET renewed_at = strftime('%Y-%m-%dT%H:%M:%SZ','now') WHERE " + std::string(kLeaseRow)));
  BindLease(stmt, mine);
  COV_RETURN_IF_ERROR(stmt.Run().WithContext("renewing the lease of run " + mine.run_id));
  if (db_->Changes() != 1) {
    return Status::AlreadyExists("run '" + mine.run_id + "' was taken over by another process while this one wrote it " +
                                 "(its lease was not renewed in time); stopping so that one process writes it");
  }
  return Status::Ok();
}

Status Registry::ReleaseRunLease(const RunLease& mine) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "DELETE FROM run_leases WHERE " + std::string(kLeaseRow)));
  BindLease(stmt, mine);
  return stmt.Run().WithContext("giving back the lease of run " + mine.run_id);
}

Status Registry::MarkInFlight(const std::string& run_id, const std::string& item, const std::string& host,
                              int64_t pid) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT OR REPLACE INTO in_flight(run_id, item, started_at, host, pid) "
      "VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%SZ','now'), ?3, ?4)"));
  stmt.Bind(1, run_id).Bind(2, item).Bind(3, host).Bind(4, pid);
  return stmt.Run().WithContext("marking " + item + " in flight in run " + run_id);
}

Result<std::vector<std::string>> Registry::InFlight(const std::string& run_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT item FROM in_flight WHERE run_id = ?1 ORDER BY item"));
  stmt.Bind(1, run_id);
  return FirstColumn(stmt);
}

Status Registry::RecordModelStage(const std::string& run_id, const std::string& model_id, const std::string& profile,
                                  const std::string& stage, const std::vector<ModelResultRecord>& items) {
  return InTransaction(*db_, [&]() -> Status {
    // Whatever profile the stage ran under before, its new result replaces it.
    COV_ASSIGN_OR_RETURN(auto del, db_->Prepare(
        "DELETE FROM model_results WHERE run_id = ?1 AND model_id = ?2 AND stage = ?3"));
    del.Bind(1, run_id).Bind(2, model_id).Bind(3, stage);
    COV_RETURN_IF_ERROR(del.Run());
    COV_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO model_results(run_id, model_id, profile, stage, item, outcome, error, blocked_by, family, "
        "max_abs_err, max_rel_err, cosine, error_ratio, seconds, detail_json, attempts, flaky, attempt_outcomes) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"));
    for (const ModelResultRecord& record : items) {
      const ModelItemResult& r = record.result;
      COV_RETURN_IF_ERROR(ins.Reset());
      ins.Bind(1, run_id).Bind(2, model_id).Bind(3, profile).Bind(4, stage).Bind(5, r.item);
      ins.Bind(6, OutcomeName(r.outcome)).Bind(7, r.error).Bind(8, record.blocked_by).Bind(9, record.family);
      ins.Bind(10, r.max_abs_err).Bind(11, r.max_rel_err).Bind(12, r.cosine).Bind(13, r.error_ratio);
      ins.Bind(14, r.seconds).Bind(15, DumpJson(r.detail)).Bind(16, r.attempts).Bind(17, r.flaky ? 1 : 0);
      if (r.attempt_outcomes.empty()) ins.BindNull(18); else ins.Bind(18, r.AttemptOutcomesText());
      COV_RETURN_IF_ERROR(ins.Run());
    }
    COV_ASSIGN_OR_RETURN(auto clear, db_->Prepare("DELETE FROM in_flight WHERE run_id = ?1 AND item = ?2"));
    clear.Bind(1, run_id).Bind(2, "model:" + model_id + ":" + stage);
    return clear.Run();
  }).WithContext("recording the " + stage + " stage of " + model_id + " (" + profile + ") in run " + run_id);
}

}  // namespace coverage::registry

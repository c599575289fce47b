#include "registry/registry.h"

#include <string>

#include "registry/schema.h"
#include "registry/sqlite.h"

namespace coverage::registry {
namespace {

Result<int> ReadUserVersion(Database& db) {
  COV_ASSIGN_OR_RETURN(auto stmt, db.Prepare("PRAGMA user_version"));
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return Status::Corruption("PRAGMA user_version returned no row in " + db.path());
  return static_cast<int>(stmt.Int(0));
}

Status Migrate(Database& db, int from) {
  for (const Migration& m : Migrations()) {
    if (m.version <= from) continue;
    Status s = InTransaction(db, [&]() -> Status {
      COV_RETURN_IF_ERROR(db.Exec(m.sql));
      return db.Exec("PRAGMA user_version = " + std::to_string(m.version));
    });
    if (!s.ok()) return s.WithContext("applying migration " + std::to_string(m.version) + " (" +
                                      std::string(m.description) + ")");
  }
  return Status::Ok();
}

std::string DTypesColumn(const OpCase& c) {
  std::string out = " ";
  for (DType d : c.DTypes()) {
    out += DTypeName(d);
    out += ' ';
  }
  return out;
}

// The first column of every row, as text.
Result<std::vector<std::string>> FirstColumn(Statement& stmt) {
  std::vector<std::string> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back(stmt.Text(0));
  }
  return out;
}

}  // namespace

Registry::Registry(std::unique_ptr<Database> db, int version) : db_(std::move(db)), schema_version_(version) {}
Registry::~Registry() = default;

Result<std::unique_ptr<Registry>> Registry::Open(const std::string& path, const RegistryOptions& options) {
  COV_ASSIGN_OR_RETURN(auto db, Database::Open(path, options.read_only, options.busy_timeout_ms));
  COV_ASSIGN_OR_RETURN(int version, ReadUserVersion(*db));
  if (version > LatestSchemaVersion()) {
    return Status::Unsupported("registry '" + path + "' has schema version " + std::to_string(version) +
                               ", newer than this build knows (" + std::to_string(LatestSchemaVersion()) +
                               "); upgrade coverage");
  }
  if (version == 0) {
    COV_ASSIGN_OR_RETURN(auto tables, db->Prepare("SELECT COUNT(*) FROM sqlite_master"));
    COV_ASSIGN_OR_RETURN(bool row, tables.Step());
    if (row && tables.Int(0) > 0) {
      return Status::InvalidArgument("'" + path + "' is an SQLite database of something else (it has tables but no "
                                     "coverage schema); it was left unchanged: choose another --registry");
    }
  }
  if (version < LatestSchemaVersion()) {
    if (options.read_only) {
      if (version == 0) return Status::NotFound("'" + path + "' is not a coverage registry (empty or new file)");
      return Status::InvalidArgument("registry '" + path + "' needs migrating; open it read-write once");
    }
    COV_RETURN_IF_ERROR(Migrate(*db, version));
    version = LatestSchemaVersion();
  }
  return std::unique_ptr<Registry>(new Registry(std::move(db), version));
}

Status Registry::Begin() { return db_->Exec("BEGIN IMMEDIATE"); }
Status Registry::Commit() {
  Status s = db_->Exec("COMMIT");
  if (!s.ok()) db_->Exec("ROLLBACK").IgnoreError();
  return s;
}
Status Registry::Rollback() { return db_->Exec("ROLLBACK"); }

Status Registry::UpsertModel(const ModelRecord& model) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO models(id, model_type, source, config_json) VALUES (?1, ?2, ?3, ?4) "
      "ON CONFLICT(id) DO UPDATE SET model_type = excluded.model_type, source = excluded.source, "
      "config_json = COALESCE(NULLIF(excluded.config_json, ''), models.config_json)"));
  stmt.Bind(1, model.id).Bind(2, model.model_type).Bind(3, model.source).Bind(4, model.config_json);
  return stmt.Run();
}

Result<int64_t> Registry::UpsertCase(const OpCase& op_case, const CaseCost& cost) {
  const std::string key = op_case.Key();
  // DO UPDATE (not DO NOTHING) so RETURNING yields the id of an existing row.
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO op_cases(key, op, overload, case_json, case_version, dtypes, summary, flops, bytes) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) "
      "ON CONFLICT(key) DO UPDATE SET flops = excluded.flops, bytes = excluded.bytes "
      "RETURNING case_id"));
  stmt.Bind(1, key).Bind(2, op_case.op).Bind(3, op_case.overload).Bind(4, op_case.ToCanonicalJson());
  stmt.Bind(5, kOpCaseVersion).Bind(6, DTypesColumn(op_case)).Bind(7, op_case.Summary());
  stmt.Bind(8, cost.flops).Bind(9, cost.bytes);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return Status::Internal("UPSERT of case " + key + " returned no id");
  return stmt.Int(0);
}

Status Registry::AddCaseSource(int64_t case_id, const CaseSource& source) {
  // Provenance may name a model the registry has not crawled yet.
  COV_ASSIGN_OR_RETURN(auto model, db_->Prepare("INSERT INTO models(id) VALUES (?1) ON CONFLICT(id) DO NOTHING"));
  model.Bind(1, source.model_id);
  COV_RETURN_IF_ERROR(model.Run());
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO case_sources(case_id, model_id, module_path, call_site, profile, depth, call_count) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) "
      "ON CONFLICT(case_id, model_id, module_path, profile, depth, call_site) "
      "DO UPDATE SET call_count = case_sources.call_count + excluded.call_count"));
  stmt.Bind(1, case_id).Bind(2, source.model_id).Bind(3, source.module_path).Bind(4, source.call_site);
  stmt.Bind(5, source.profile).Bind(6, source.depth).Bind(7, source.call_count);
  return stmt.Run();
}

Status Registry::ClearCaseSources(const std::string& model_id, const std::string& profile) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("DELETE FROM case_sources WHERE model_id = ?1 AND profile = ?2"));
  stmt.Bind(1, model_id).Bind(2, profile);
  return stmt.Run();
}

Result<std::optional<CrawlState>> Registry::GetCrawl(const std::string& crawl_id) {
  COV_ASSIGN_OR_RETURN(auto stmt,
                       db_->Prepare("SELECT next_url, pages, models, rejects FROM crawls WHERE crawl_id = ?1"));
  stmt.Bind(1, crawl_id);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<CrawlState>();
  CrawlState c;
  c.crawl_id = crawl_id;
  if (!stmt.IsNull(0)) c.next_url = stmt.Text(0);
  c.pages = stmt.Int(1);
  c.models = stmt.Int(2);
  c.rejects = stmt.Int(3);
  return std::optional<CrawlState>(std::move(c));
}

Status Registry::StartCrawl(const std::string& crawl_id) {
  // A restarted crawl lists everything again: its old rejects would repeat.
  COV_ASSIGN_OR_RETURN(auto clear, db_->Prepare("DELETE FROM crawl_rejects WHERE crawl_id = ?1"));
  clear.Bind(1, crawl_id);
  COV_RETURN_IF_ERROR(clear.Run());
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "INSERT INTO crawls(crawl_id, next_url) VALUES (?1, ?1) ON CONFLICT(crawl_id) DO UPDATE SET "
      "next_url = ?1, pages = 0, models = 0, rejects = 0, "
      "started_at = strftime('%Y-%m-%dT%H:%M:%SZ','now'), updated_at = NULL"));
  stmt.Bind(1, crawl_id);
  return stmt.Run();
}

Status Registry::StoreCrawlPage(const std::string& crawl_id, const std::vector<HubModelRecord>& models,
                                const std::vector<std::pair<std::string, std::string>>& rejects,
                                const std::optional<std::string>& next_url) {
  return InTransaction(*db_, [&]() -> Status {
    COV_ASSIGN_OR_RETURN(auto upsert, db_->Prepare(
        "INSERT INTO models(id, model_type, source, author, sha, downloads, likes, tags_json, pipeline_tag, "
        "library_name, created_at, last_modified, gated, private, architectures_json, crawled_at) "
        "VALUES (?1, ?2, 'hub', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
        "strftime('%Y-%m-%dT%H:%M:%SZ','now')) "
        "ON CONFLICT(id) DO UPDATE SET model_type = COALESCE(NULLIF(excluded.model_type, ''), models.model_type), "
        "author = excluded.author, downloads = excluded.downloads, likes = excluded.likes, "
        "tags_json = excluded.tags_json, pipeline_tag = excluded.pipeline_tag, "
        "library_name = excluded.library_name, created_at = excluded.created_at, "
        "last_modified = excluded.last_modified, gated = excluded.gated, private = excluded.private, "
        "architectures_json = excluded.architectures_json, crawled_at = excluded.crawled_at, "
        // A new commit invalidates a fetched config: fetch it again.
        "config_status = CASE WHEN excluded.sha != '' AND models.sha IS NOT NULL AND models.sha != excluded.sha "
        "THEN NULL ELSE models.config_status END, "
        "sha = CASE WHEN excluded.sha != '' THEN excluded.sha ELSE models.sha END"));
    for (const auto& m : models) {
      upsert.Bind(1, m.id).Bind(2, m.model_type).Bind(3, m.author).Bind(4, m.sha).Bind(5, m.downloads);
      upsert.Bind(6, m.likes).Bind(7, m.tags_json).Bind(8, m.pipeline_tag).Bind(9, m.library_name);
      upsert.Bind(10, m.created_at).Bind(11, m.last_modified).Bind(12, m.gated).Bind(13, m.is_private ? 1 : 0);
      upsert.Bind(14, m.architectures_json);
      COV_RETURN_IF_ERROR(upsert.Run());
    }
    COV_ASSIGN_OR_RETURN(auto reject, db_->Prepare("INSERT INTO crawl_rejects(crawl_id, raw, reason) VALUES (?1, ?2, ?3)"));
    for (const auto& [raw, reason] : rejects) {
      reject.Bind(1, crawl_id).Bind(2, raw.substr(0, 300)).Bind(3, reason);
      COV_RETURN_IF_ERROR(reject.Run());
    }
    COV_ASSIGN_OR_RETURN(auto update, db_->Prepare(
        "UPDATE crawls SET next_url = ?2, pages = pages + 1, models = models + ?3, rejects = rejects + ?4, "
        "updated_at = strftime('%Y-%m-%dT%H:%M:%SZ','now') WHERE crawl_id = ?1"));
    update.Bind(1, crawl_id);
    if (next_url) {
      update.Bind(2, *next_url);
    } else {
      update.BindNull(2);
    }
    update.Bind(3, static_cast<int64_t>(models.size())).Bind(4, static_cast<int64_t>(rejects.size()));
    COV_RETURN_IF_ERROR(update.Run());
    if (db_->Changes() != 1) return Status::NotFound("crawl '" + crawl_id + "' was not started");
    return Status::Ok();
  });
}

Result<std::vector<std::string>> Registry::ModelsWithoutConfig(int64_t limit) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT id FROM models WHERE crawled_at IS NOT NULL AND config_status IS NULL "
      "ORDER BY downloads DESC, id LIMIT ?1"));
  stmt.Bind(1, limit > 0 ? limit : int64_t{-1});
  return FirstColumn(stmt);
}

Status Registry::StoreConfig(const std::string& model_id, const std::string& status, const std::string& reason,
                             const std::string& config_json) {
  if (status != "fetched" && status != "missing" && status != "gated" && status != "invalid") {
    return Status::Internal("unknown config status '" + status + "'");
  }
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "UPDATE models SET config_status = ?2, config_reason = ?3, "
      "config_json = CASE WHEN ?2 = 'fetched' THEN ?4 ELSE config_json END WHERE id = ?1"));
  stmt.Bind(1, model_id).Bind(2, status).Bind(3, reason).Bind(4, config_json);
  COV_RETURN_IF_ERROR(stmt.Run());
  if (db_->Changes() != 1) return Status::NotFound("model '" + model_id + "' is not in the registry");
  return Status::Ok();
}

Status Registry::ForEachHubModel(
    const std::function<Status(const HubModelRecord&, const std::string&, const std::string&)>& fn) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT id, COALESCE(author, ''), COALESCE(sha, ''), COALESCE(downloads, 0), COALESCE(likes, 0), "
      "COALESCE(tags_json, '[]'), COALESCE(pipeline_tag, ''), COALESCE(library_name, ''), COALESCE(created_at, ''), "
      "COALESCE(last_modified, ''), COALESCE(gated, 'false'), COALESCE(private, 0), COALESCE(model_type, ''), "
      "COALESCE(architectures_json, '[]'), COALESCE(config_status, ''), COALESCE(config_json, '') "
      "FROM models WHERE crawled_at IS NOT NULL ORDER BY id"));
  HubModelRecord r;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return Status::Ok();
    r.id = stmt.Text(0);
    r.author = stmt.Text(1);
    r.sha = stmt.Text(2);
    r.downloads = stmt.Int(3);
    r.likes = stmt.Int(4);
    r.tags_json = stmt.Text(5);
    r.pipeline_tag = stmt.Text(6);
    r.library_name = stmt.Text(7);
    r.created_at = stmt.Text(8);
    r.last_modified = stmt.Text(9);
    r.gated = stmt.Text(10);
    r.is_private = stmt.Int(11) != 0;
    r.model_type = stmt.Text(12);
    r.architectures_json = stmt.Text(13);
    COV_RETURN_IF_ERROR(fn(r, stmt.Text(14), stmt.Text(15)));
  }
}

Result<std::vector<ConfigRow>> Registry::ConfigsNeedingFeatures(int version, const std::string& after, int limit) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT m.id, m.config_json FROM models m WHERE m.config_status = 'fetched' AND m.config_json IS NOT NULL "
      "AND m.id > ?1 AND NOT EXISTS (SELECT 1 FROM features f WHERE f.model_id = m.id AND f.version = ?2) "
      "ORDER BY m.id LIMIT ?3"));
  stmt.Bind(1, after).Bind(2, version).Bind(3, limit);
  std::vector<ConfigRow> rows;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    rows.push_back({stmt.Text(0), stmt.Text(1)});
  }
  return rows;
}

Result<int64_t> Registry::StoreFeatures(const std::vector<FeatureRecord>& features) {
  int64_t stored = 0;
  COV_RETURN_IF_ERROR(InTransaction(*db_, [&]() -> Status {
    // WHERE EXISTS: a crawl may have replaced the config meanwhile (its
    // trigger found no row to drop); features of the old text must not land.
    COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
        "INSERT INTO features (model_id, version, status, reason, understood, features_json, coarse, fine) "
        "SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8 WHERE EXISTS (SELECT 1 FROM models WHERE id = ?1 AND config_json = ?9) "
        "ON CONFLICT(model_id) DO UPDATE SET version = excluded.version, "
        "status = excluded.status, reason = excluded.reason, understood = excluded.understood, "
        "features_json = excluded.features_json, coarse = excluded.coarse, fine = excluded.fine, "
        "derived_at = strftime('%Y-%m-%dT%H:%M:%SZ','now')"));
    for (const FeatureRecord& f : features) {
      stmt.Bind(1, f.model_id).Bind(2, f.version).Bind(3, f.ok ? "ok" : "failed");
      if (f.ok) {
        stmt.BindNull(4).Bind(5, f.understood ? 1 : 0).Bind(6, f.features_json).Bind(7, f.coarse).Bind(8, f.fine);
      } else {
        stmt.Bind(4, f.reason).Bind(5, 0).BindNull(6).BindNull(7).BindNull(8);
      }
      stmt.Bind(9, f.derived_from);
      COV_RETURN_IF_ERROR(stmt.Run());
      stored += db_->Changes();
    }
    return Status::Ok();
  }));
  return stored;
}

Status Registry::ForEachFeature(int version, const std::function<Status(const FeatureRecord&)>& fn) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT f.model_id, f.status, f.reason, f.understood, f.features_json, f.coarse, f.fine, "
      "COALESCE(m.downloads, 0) FROM features f JOIN models m ON m.id = f.model_id WHERE f.version = ?1 "
      "AND m.config_status = 'fetched' ORDER BY f.model_id"));
  stmt.Bind(1, version);
  FeatureRecord r;
  r.version = version;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return Status::Ok();
    r.model_id = stmt.Text(0);
    r.ok = stmt.Text(1) == "ok";
    r.reason = stmt.Text(2);
    r.understood = stmt.Int(3) != 0;
    r.features_json = stmt.Text(4);
    r.coarse = stmt.Text(5);
    r.fine = stmt.Text(6);
    r.downloads = stmt.Int(7);
    COV_RETURN_IF_ERROR(fn(r));
  }
}

namespace {

// Whether the newest stored selection is `selection` with these
// representatives and members; its id in *id when it is.
Result<bool> SameAsNewestSelection(Database& db, const SelectionRecord& selection,
                                   const std::vector<RepresentativeRecord>& reps,
                                   const std::vector<MemberRecord>& members, int64_t* id) {
  COV_ASSIGN_OR_RETURN(auto sel, db.Prepare(
      "SELECT selection_id, k, seed, feature_version, models, coverage_json, warnings_json FROM selections "
      "ORDER BY selection_id DESC LIMIT 1"));
  COV_ASSIGN_OR_RETURN(bool row, sel.Step());
  if (!row || sel.Int(1) != selection.k || sel.Int(2) != static_cast<int64_t>(selection.seed) ||
      sel.Int(3) != selection.feature_version || sel.Int(4) != selection.models ||
      sel.Text(5) != selection.coverage_json || sel.Text(6) != selection.warnings_json) {
    return false;
  }
  *id = sel.Int(0);
  COV_ASSIGN_OR_RETURN(auto rep, db.Prepare(
      "SELECT rank, model_id, reason, distance_when_chosen, stands_for, downloads_represented FROM representatives "
      "WHERE selection_id = ?1 ORDER BY rank"));
  rep.Bind(1, *id);
  size_t i = 0;
  for (;; ++i) {
    COV_ASSIGN_OR_RETURN(bool more, rep.Step());
    if (!more) break;
    if (i >= reps.size()) return false;
    const RepresentativeRecord& r = reps[i];
    if (rep.Int(0) != r.rank || rep.Text(1) != r.model_id || rep.Text(2) != r.reason ||
        rep.Double(3) != r.distance_when_chosen || rep.Int(4) != r.stands_for ||
        rep.Int(5) != r.downloads_represented) {
      return false;
    }
  }
  if (i != reps.size()) return false;
  std::map<std::string, std::pair<int, double>> want;
  for (const MemberRecord& m : members) want[m.model_id] = {m.representative_rank, m.distance};
  COV_ASSIGN_OR_RETURN(auto mem, db.Prepare(
      "SELECT model_id, representative_rank, distance FROM selection_members WHERE selection_id = ?1"));
  mem.Bind(1, *id);
  size_t seen = 0;
  for (;; ++seen) {
    COV_ASSIGN_OR_RETURN(bool more, mem.Step());
    if (!more) break;
    auto it = want.find(mem.Text(0));
    if (it == want.end() || it->second != std::make_pair(static_cast<int>(mem.Int(1)), mem.Double(2))) return false;
  }
  return seen == want.size();
}

}  // namespace

Result<int64_t> Registry::StoreSelection(const SelectionRecord& selection, const std::vector<RepresentativeRecord>& reps,
                                         const std::vector<MemberRecord>& members, bool* unchanged) {
  int64_t id = 0;
  if (unchanged) *unchanged = false;
  COV_RETURN_IF_ERROR(InTransaction(*db_, [&]() -> Status {
    COV_ASSIGN_OR_RETURN(bool same, SameAsNewestSelection(*db_, selection, reps, members, &id));
    if (same) {
      if (unchanged) *unchanged = true;
      return Status::Ok();
    }
    COV_ASSIGN_OR_RETURN(auto sel, db_->Prepare(
        "INSERT INTO selections (k, seed, feature_version, models, coverage_json, warnings_json) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
    sel.Bind(1, selection.k).Bind(2, static_cast<int64_t>(selection.seed)).Bind(3, selection.feature_version)
        .Bind(4, selection.models).Bind(5, selection.coverage_json).Bind(6, selection.warnings_json);
    COV_RETURN_IF_ERROR(sel.Run());
    id = db_->LastInsertRowId();
    COV_ASSIGN_OR_RETURN(auto rep, db_->Prepare(
        "INSERT INTO representatives (selection_id, rank, model_id, reason, distance_when_chosen, stands_for, "
        "downloads_represented) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
    for (const RepresentativeRecord& r : reps) {
      rep.Bind(1, id).Bind(2, r.rank).Bind(3, r.model_id).Bind(4, r.reason).Bind(5, r.distance_when_chosen)
          .Bind(6, r.stands_for).Bind(7, r.downloads_represented);
      COV_RETURN_IF_ERROR(rep.Run());
      COV_RETURN_IF_ERROR(rep.Reset());
    }
    COV_ASSIGN_OR_RETURN(auto mem, db_->Prepare(
        "INSERT INTO selection_members (selection_id, model_id, representative_rank, distance) "
        "VALUES (?1, ?2, ?3, ?4)"));
    for (const MemberRecord& m : members) {
      mem.Bind(1, id).Bind(2, m.model_id).Bind(3, m.representative_rank).Bind(4, m.distance);
      COV_RETURN_IF_ERROR(mem.Run());
      COV_RETURN_IF_ERROR(mem.Reset());
    }
    return Status::Ok();
  }));
  return id;
}

Result<std::vector<SelectedModel>> Registry::SelectionModels(int64_t selection_id, int64_t* resolved_id) {
  if (selection_id <= 0) {
    COV_ASSIGN_OR_RETURN(auto newest, db_->Prepare("SELECT MAX(selection_id) FROM selections"));
    COV_ASSIGN_OR_RETURN(bool row, newest.Step());
    if (!row || newest.IsNull(0)) {
      return Status::NotFound("the registry holds no selection yet: run coverage select first");
    }
    selection_id = newest.Int(0);
  } else {
    COV_ASSIGN_OR_RETURN(auto exists, db_->Prepare("SELECT 1 FROM selections WHERE selection_id = ?1"));
    exists.Bind(1, selection_id);
    COV_ASSIGN_OR_RETURN(bool row, exists.Step());
    if (!row) return Status::NotFound("there is no selection " + std::to_string(selection_id));
  }
  if (resolved_id) *resolved_id = selection_id;
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT r.rank, r.model_id, COALESCE(m.model_type, ''), "
      "CASE WHEN f.status = 'ok' THEN f.features_json ELSE '' END, COALESCE(m.config_json, '') "
      "FROM representatives r LEFT JOIN models m ON m.id = r.model_id LEFT JOIN features f ON f.model_id = r.model_id "
      "WHERE r.selection_id = ?1 ORDER BY r.rank"));
  stmt.Bind(1, selection_id);
  std::vector<SelectedModel> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return out;
    out.push_back({static_cast<int>(stmt.Int(0)), stmt.Text(1), stmt.Text(2), stmt.Text(3), stmt.Text(4)});
  }
}

Result<int64_t> Registry::PruneOrphanCases() {
  COV_RETURN_IF_ERROR(db_->Exec(
      "DELETE FROM op_cases WHERE NOT EXISTS (SELECT 1 FROM case_sources s WHERE s.case_id = op_cases.case_id) "
      "AND NOT EXISTS (SELECT 1 FROM opinfo_samples o WHERE o.case_id = op_cases.case_id) "
      "AND NOT EXISTS (SELECT 1 FROM results r WHERE r.case_id = op_cases.case_id) "
      "AND NOT EXISTS (SELECT 1 FROM program_calls p WHERE p.case_id = op_cases.case_id)"));
  return static_cast<int64_t>(db_->Changes());
}

Result<std::vector<StoredCase>> Registry::FindCases(const CaseFilter& filter) {
  std::string sql =
      "SELECT c.case_id, c.key, c.case_json, c.flops, c.bytes, "
      "  (SELECT COUNT(*) FROM case_sources s WHERE s.case_id = c.case_id), "
      "  (SELECT COALESCE(SUM(call_count), 0) FROM case_sources s WHERE s.case_id = c.case_id), "
      "  (SELECT COALESCE(group_concat(DISTINCT s.model_id), '') FROM case_sources s WHERE s.case_id = c.case_id), "
      "  (SELECT COUNT(*) FROM opinfo_samples o WHERE o.case_id = c.case_id) "
      "FROM op_cases c WHERE 1";
  std::vector<std::string> text_params;
  std::vector<std::pair<int, double>> real_params;  // (position, value)
  int next = 1;
  auto add_text = [&](std::string v) {
    text_params.push_back(std::move(v));
    return "?" + std::to_string(next++);
  };
  auto add_real = [&](double v) {
    real_params.emplace_back(next, v);
    text_params.emplace_back();  // keep positions aligned
    return "?" + std::to_string(next++);
  };

  if (!filter.ops.empty()) {
    sql += " AND (";
    for (size_t i = 0; i < filter.ops.size(); ++i) {
      std::string p = add_text(NormaliseOpName(filter.ops[i]));
      if (i) sql += " OR ";
      sql += "c.op = " + p + " OR (c.op || '.' || c.overload) = " + p;
    }
    sql += ")";
  }
  if (!filter.keys.empty()) {
    sql += " AND c.key IN (";
    for (size_t i = 0; i < filter.keys.size(); ++i) sql += (i ? ", " : "") + add_text(filter.keys[i]);
    sql += ")";
  }
  if (!filter.dtype.empty()) {
    sql += " AND instr(c.dtypes, " + add_text(" " + filter.dtype + " ") + ") > 0";
  }
  if (!filter.model.empty() || !filter.profile.empty()) {
    sql += " AND EXISTS (SELECT 1 FROM case_sources s WHERE s.case_id = c.case_id";
    if (!filter.model.empty()) sql += " AND s.model_id GLOB " + add_text(filter.model);
    if (!filter.profile.empty()) sql += " AND s.profile = " + add_text(filter.profile);
    sql += ")";
  }
  if (filter.source == "captured") {
    sql += " AND EXISTS (SELECT 1 FROM case_sources s WHERE s.case_id = c.case_id)";
  } else if (filter.source == "opinfo") {
    sql += " AND EXISTS (SELECT 1 FROM opinfo_samples o WHERE o.case_id = c.case_id)";
  } else if (!filter.source.empty()) {
    return Status::InvalidArgument("source '" + filter.source + "': expected captured or opinfo");
  }
  if (filter.min_flops) sql += " AND c.flops >= " + add_real(*filter.min_flops);
  if (filter.max_flops) sql += " AND c.flops <= " + add_real(*filter.max_flops);
  for (const DimPredicate& d : filter.dims) {
    sql += " AND EXISTS (SELECT 1 FROM json_each(c.case_json, '$.args') a WHERE "
           "json_extract(a.value, '$.type') = 'tensor'";
    if (d.arg != "*") sql += " AND json_extract(a.value, '$.name') = " + add_text(d.arg);
    std::string lhs;
    if (d.index) {
      std::string path = *d.index >= 0 ? "$.tensor.shape[" + std::to_string(*d.index) + "]"
                                       : "$.tensor.shape[#" + std::to_string(*d.index) + "]";
      lhs = "json_extract(a.value, " + add_text(path) + ")";
    } else {
      lhs = "json_array_length(a.value, '$.tensor.shape')";
    }
    sql += " AND " + lhs + " " + d.op + " " + add_real(static_cast<double>(d.value)) + ")";
  }
  sql += " ORDER BY c.op, c.overload, c.flops DESC, c.key";
  if (filter.limit > 0) sql += " LIMIT " + std::to_string(filter.limit);

  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(sql));
  size_t real_i = 0;
  for (int pos = 1; pos < next; ++pos) {
    if (real_i < real_params.size() && real_params[real_i].first == pos) {
      stmt.Bind(pos, real_params[real_i++].second);
    } else {
      stmt.Bind(pos, text_params[pos - 1]);
    }
  }
  std::vector<StoredCase> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    StoredCase c;
    c.case_id = stmt.Int(0);
    c.key = stmt.Text(1);
    auto parsed = OpCase::FromJson(stmt.Text(2));
    if (!parsed) return parsed.error().WithContext("case " + c.key + " in " + db_->path());
    c.op_case = std::move(*parsed);
    c.cost.flops = stmt.Double(3);
    c.cost.bytes = stmt.Double(4);
    c.num_sources = stmt.Int(5);
    c.total_calls = stmt.Int(6);
    c.models = stmt.Text(7);
    c.opinfo_samples = stmt.Int(8);
    out.push_back(std::move(c));
  }
  return out;
}

Result<std::optional<StoredCase>> Registry::GetCaseByKey(const std::string& key) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT case_id, key, case_json, flops, bytes FROM op_cases WHERE key = ?1"));
  stmt.Bind(1, key);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<StoredCase>();
  StoredCase c;
  c.case_id = stmt.Int(0);
  c.key = stmt.Text(1);
  COV_ASSIGN_OR_RETURN(c.op_case, OpCase::FromJson(stmt.Text(2)));
  c.cost = {stmt.Double(3), stmt.Double(4)};
  return std::optional<StoredCase>(std::move(c));
}

Result<int64_t> Registry::CountCases() {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT COUNT(*) FROM op_cases"));
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  (void)row;
  return stmt.Int(0);
}

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
      "INSERT INTO runs(run_id, stage, backend, started_at, libtorch_version, host, git_revision, config_json) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  stmt.Bind(1, run.run_id).Bind(2, run.stage).Bind(3, run.backend).Bind(4, run.started_at);
  stmt.Bind(5, run.libtorch_version).Bind(6, run.host).Bind(7, run.git_revision).Bind(8, run.config_json);
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

Status Registry::RecordResult(const ResultRecord& r) {
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
    stmt.Bind(1, r.run_id).Bind(2, r.case_id).Bind(3, OutcomeName(r.outcome)).Bind(4, r.error);
    stmt.Bind(5, r.max_abs_err).Bind(6, r.max_rel_err).Bind(7, r.mismatch_frac).Bind(8, r.cosine);
    stmt.Bind(9, r.error_ratio).Bind(10, r.first_call_us).Bind(11, r.warm_us).Bind(12, r.detail_json);
    stmt.Bind(13, r.attempts).Bind(14, r.flaky ? 1 : 0);
    if (r.attempt_outcomes.empty()) stmt.BindNull(15); else stmt.Bind(15, r.attempt_outcomes);
    stmt.Bind(16, r.warm_spread_us);
    if (r.counters_json.empty()) stmt.BindNull(17); else stmt.Bind(17, r.counters_json);
    stmt.Bind(18, r.warm_min_us);
    COV_RETURN_IF_ERROR(stmt.Run());
    COV_ASSIGN_OR_RETURN(auto clear, db_->Prepare("DELETE FROM in_flight WHERE run_id = ?1 AND item = ?2"));
    clear.Bind(1, r.run_id).Bind(2, "case:" + std::to_string(r.case_id));
    return clear.Run();
  }).WithContext("recording result of case " + std::to_string(r.case_id) + " in run " + r.run_id);
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
    for (const ModelResultRecord& r : items) {
      COV_RETURN_IF_ERROR(ins.Reset());
      ins.Bind(1, run_id).Bind(2, model_id).Bind(3, profile).Bind(4, stage).Bind(5, r.item);
      ins.Bind(6, OutcomeName(r.outcome)).Bind(7, r.error).Bind(8, r.blocked_by).Bind(9, r.family);
      ins.Bind(10, r.max_abs_err).Bind(11, r.max_rel_err).Bind(12, r.cosine).Bind(13, r.error_ratio);
      ins.Bind(14, r.seconds).Bind(15, r.detail_json).Bind(16, r.attempts).Bind(17, r.flaky ? 1 : 0);
      if (r.attempt_outcomes.empty()) ins.BindNull(18); else ins.Bind(18, r.attempt_outcomes);
      COV_RETURN_IF_ERROR(ins.Run());
    }
    COV_ASSIGN_OR_RETURN(auto clear, db_->Prepare("DELETE FROM in_flight WHERE run_id = ?1 AND item = ?2"));
    clear.Bind(1, run_id).Bind(2, "model:" + model_id + ":" + stage);
    return clear.Run();
  }).WithContext("recording the " + stage + " stage of " + model_id + " (" + profile + ") in run " + run_id);
}

Result<QueryRows> Registry::Query(const std::string& sql, const std::vector<std::string>& text_params) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(sql));
  for (size_t i = 0; i < text_params.size(); ++i) stmt.Bind(static_cast<int>(i + 1), text_params[i]);
  QueryRows out;
  for (int c = 0; c < stmt.ColumnCount(); ++c) out.columns.push_back(stmt.ColumnName(c));
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    std::vector<std::string> r;
    for (int c = 0; c < stmt.ColumnCount(); ++c) r.push_back(stmt.Text(c));
    out.rows.push_back(std::move(r));
  }
  return out;
}

}  // namespace coverage::registry

// Registry: what the crawl and the selection store (crawls, hub models,
// configs, features, selections). See registry.h.
#include <map>
#include <string>

#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {

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

Result<std::vector<SelectedModel>> Registry::ModelsById(const std::vector<std::string>& ids) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT COALESCE(m.model_type, ''), CASE WHEN f.status = 'ok' THEN f.features_json ELSE '' END, "
      "COALESCE(m.config_json, '') FROM models m LEFT JOIN features f ON f.model_id = m.id WHERE m.id = ?1"));
  std::vector<SelectedModel> out;
  for (const std::string& id : ids) {
    stmt.Bind(1, id);
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return Status::NotFound("the registry has no model '" + id + "' (capture it first: coverage capture --models)");
    out.push_back({static_cast<int>(out.size()) + 1, id, stmt.Text(0), stmt.Text(1), stmt.Text(2)});
    COV_RETURN_IF_ERROR(stmt.Reset());
  }
  return out;
}

Result<std::vector<std::string>> Registry::CapturedModelIds() {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT DISTINCT model_id FROM programs WHERE status = 'captured' ORDER BY model_id"));
  std::vector<std::string> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return out;
    out.push_back(stmt.Text(0));
  }
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

}  // namespace coverage::registry

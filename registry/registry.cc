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
      "INSERT INTO models(id, model_type, source, config_json, config_status) "
      "VALUES (?1, ?2, ?3, ?4, CASE WHEN ?4 <> '' THEN 'fetched' END) "
      "ON CONFLICT(id) DO UPDATE SET model_type = excluded.model_type, source = excluded.source, "
      "config_json = COALESCE(NULLIF(excluded.config_json, ''), models.config_json), "
      "config_status = COALESCE(excluded.config_status, models.config_status)"));
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

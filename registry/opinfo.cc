// Op cases from PyTorch's OpInfo samples: storage and reads (schema v10).
#include <unordered_map>

#include <fmt/format.h>

#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {

Status Registry::StoreOpInfo(OpInfoImportRecord* rec, const std::vector<OpInfoSampleCall>& calls) {
  if (rec->status != "imported" && rec->status != "skipped") {
    return Status::InvalidArgument("StoreOpInfo: status '" + rec->status + "': expected imported or skipped");
  }
  Status s = InTransaction(*db_, [&]() -> Status {
    COV_ASSIGN_OR_RETURN(auto del, db_->Prepare(
        "DELETE FROM opinfo_samples WHERE opinfo = ?1 AND variant = ?2 AND dtype = ?3"));
    del.Bind(1, rec->opinfo).Bind(2, rec->variant).Bind(3, rec->dtype);
    COV_RETURN_IF_ERROR(del.Run());
    COV_ASSIGN_OR_RETURN(auto sample, db_->Prepare(
        "INSERT INTO opinfo_samples(case_id, opinfo, variant, dtype, sample, sample_name, call_index) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"));
    std::unordered_map<std::string, int64_t> case_ids;  // key -> case_id
    for (const OpInfoSampleCall& c : calls) {
      const std::string key = c.op_case.Key();
      auto it = case_ids.find(key);
      if (it == case_ids.end()) {
        COV_ASSIGN_OR_RETURN(int64_t id, UpsertCase(c.op_case, c.cost));
        it = case_ids.emplace(key, id).first;
      }
      sample.Bind(1, it->second).Bind(2, rec->opinfo).Bind(3, rec->variant).Bind(4, rec->dtype);
      sample.Bind(5, c.sample).Bind(6, c.sample_name).Bind(7, c.call_index);
      COV_RETURN_IF_ERROR(sample.Run().WithContext(fmt::format("sample {} call {}", c.sample, c.call_index)));
    }
    rec->calls = static_cast<int64_t>(calls.size());
    rec->cases = static_cast<int64_t>(case_ids.size());
    COV_ASSIGN_OR_RETURN(auto row, db_->Prepare(
        "INSERT OR REPLACE INTO opinfo_imports(opinfo, variant, dtype, status, reason, samples, failed, calls, cases, "
        "torch_version) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"));
    row.Bind(1, rec->opinfo).Bind(2, rec->variant).Bind(3, rec->dtype).Bind(4, rec->status).Bind(5, rec->reason);
    row.Bind(6, rec->samples).Bind(7, rec->failed).Bind(8, rec->calls).Bind(9, rec->cases);
    row.Bind(10, rec->torch_version);
    return row.Run();
  });
  const std::string name = rec->variant.empty() ? rec->opinfo : rec->opinfo + "." + rec->variant;
  return s.WithContext(fmt::format("storing the OpInfo samples of {} ({}) in {}", name, rec->dtype, db_->path()));
}

Result<std::vector<OpInfoImportRecord>> Registry::ListOpInfoImports() {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(
      "SELECT opinfo, variant, dtype, status, reason, samples, failed, calls, cases, torch_version, imported_at "
      "FROM opinfo_imports ORDER BY opinfo, variant, dtype"));
  std::vector<OpInfoImportRecord> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return out;
    OpInfoImportRecord r;
    r.opinfo = stmt.Text(0);
    r.variant = stmt.Text(1);
    r.dtype = stmt.Text(2);
    r.status = stmt.Text(3);
    r.reason = stmt.Text(4);
    r.samples = stmt.Int(5);
    r.failed = stmt.Int(6);
    r.calls = stmt.Int(7);
    r.cases = stmt.Int(8);
    r.torch_version = stmt.Text(9);
    r.imported_at = stmt.Text(10);
    out.push_back(std::move(r));
  }
}

Result<std::vector<std::string>> Registry::DistinctOps() {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare("SELECT DISTINCT op FROM op_cases ORDER BY op"));
  std::vector<std::string> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return out;
    out.push_back(stmt.Text(0));
  }
}

}  // namespace coverage::registry

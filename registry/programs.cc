// Programs captured by the tracer: storage and reads (schema v7).
#include <map>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cost.h"
#include "core/json_double.h"
#include "registry/registry.h"
#include "registry/sqlite.h"

namespace coverage::registry {
namespace {

std::string IdsJson(const std::vector<int64_t>& ids) { return fmt::format("[{}]", fmt::join(ids, ",")); }

Result<std::vector<int64_t>> IdsFromJson(const std::string& text, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return Status::Corruption(what + ": expected a JSON array of value ids");
  std::vector<int64_t> out;
  for (const auto& v : j) {
    if (!v.is_number_integer()) return Status::Corruption(what + ": expected integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

constexpr const char* kProgramColumns =
    "program_id, model_id, profile, tracer_version, max_layers, config_sha256, max_gb, device_option, seed, status, "
    "COALESCE(stage, ''), "
    "COALESCE(reason, ''), COALESCE(exception, ''), COALESCE(class_name, ''), COALESCE(model_type, ''), "
    "COALESCE(kind, ''), COALESCE(device, ''), COALESCE(fallback, ''), COALESCE(attn_implementation, ''), "
    "COALESCE(dtype, ''), COALESCE(layers_json, ''), COALESCE(torch_version, ''), "
    "COALESCE(transformers_version, ''), calls, cases, unsupported_calls, value_count, COALESCE(estimated_gb, 0), "
    "COALESCE(seconds, 0), COALESCE(peak_rss_mb, 0), captured_at, max_experts";

ProgramRecord ReadProgramRow(const Statement& s) {
  ProgramRecord r;
  int c = 0;
  r.program_id = s.Int(c++);
  r.model_id = s.Text(c++);
  r.profile = s.Text(c++);
  r.tracer_version = static_cast<int>(s.Int(c++));
  r.max_layers = s.Int(c++);
  r.config_sha256 = s.Text(c++);
  r.max_gb = s.Double(c++);
  r.device_option = s.Text(c++);
  r.seed = static_cast<uint64_t>(s.Int(c++));
  r.status = s.Text(c++);
  r.stage = s.Text(c++);
  r.reason = s.Text(c++);
  r.exception = s.Text(c++);
  r.info.class_name = s.Text(c++);
  r.info.model_type = s.Text(c++);
  r.info.kind = s.Text(c++);
  r.info.device = s.Text(c++);
  r.info.fallback = s.Text(c++);
  r.info.attn_implementation = s.Text(c++);
  r.info.dtype = s.Text(c++);
  r.info.layers_json = s.Text(c++);
  r.info.torch_version = s.Text(c++);
  r.info.transformers_version = s.Text(c++);
  r.calls = s.Int(c++);
  r.cases = s.Int(c++);
  r.unsupported_calls = s.Int(c++);
  r.info.value_count = s.Int(c++);
  r.info.estimated_gb = s.Double(c++);
  r.seconds = s.Double(c++);
  r.peak_rss_mb = s.Double(c++);
  r.captured_at = s.Text(c++);
  r.max_experts = s.Int(c++);
  r.info.model_id = r.model_id;
  r.info.profile = r.profile;
  r.info.tracer_version = r.tracer_version;
  return r;
}

}  // namespace

Status Registry::StoreProgram(const ModelRecord& model, ProgramRecord* rec, const Program* program) {
  if (rec->status == "captured" && program == nullptr) {
    return Status::InvalidArgument("StoreProgram: a captured pair needs its program");
  }
  Status s = InTransaction(*db_, [&]() -> Status {
    COV_RETURN_IF_ERROR(UpsertModel(model));
    {
      COV_ASSIGN_OR_RETURN(auto del, db_->Prepare("DELETE FROM programs WHERE model_id = ?1 AND profile = ?2"));
      del.Bind(1, rec->model_id).Bind(2, rec->profile);
      COV_RETURN_IF_ERROR(del.Run());
    }
    // A recapture replaces the pair's provenance instead of adding to it.
    COV_RETURN_IF_ERROR(ClearCaseSources(rec->model_id, rec->profile));
    const ProgramInfo& info = program ? program->info : rec->info;
    COV_ASSIGN_OR_RETURN(auto ins, db_->Prepare(
        "INSERT INTO programs(model_id, profile, tracer_version, max_layers, config_sha256, status, stage, reason, "
        "exception, class_name, model_type, kind, device, fallback, attn_implementation, dtype, layers_json, "
        "torch_version, transformers_version, value_count, estimated_gb, seconds, peak_rss_mb, max_gb, "
        "device_option, seed, max_experts) "
        "VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULLIF(?7, ''), NULLIF(?8, ''), NULLIF(?9, ''), NULLIF(?10, ''), "
        "NULLIF(?11, ''), NULLIF(?12, ''), NULLIF(?13, ''), NULLIF(?14, ''), NULLIF(?15, ''), NULLIF(?16, ''), "
        "NULLIF(?17, ''), NULLIF(?18, ''), NULLIF(?19, ''), ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27) RETURNING program_id"));
    ins.Bind(1, rec->model_id).Bind(2, rec->profile).Bind(3, rec->tracer_version).Bind(4, rec->max_layers);
    ins.Bind(5, rec->config_sha256).Bind(6, rec->status).Bind(7, rec->stage).Bind(8, rec->reason);
    ins.Bind(9, rec->exception).Bind(10, info.class_name).Bind(11, info.model_type).Bind(12, info.kind);
    ins.Bind(13, info.device).Bind(14, info.fallback).Bind(15, info.attn_implementation).Bind(16, info.dtype);
    ins.Bind(17, info.layers_json).Bind(18, info.torch_version).Bind(19, info.transformers_version);
    ins.Bind(20, info.value_count).Bind(21, info.estimated_gb).Bind(22, rec->seconds).Bind(23, rec->peak_rss_mb);
    ins.Bind(24, rec->max_gb).Bind(25, rec->device_option).Bind(26, static_cast<int64_t>(rec->seed));
    ins.Bind(27, rec->max_experts);
    COV_ASSIGN_OR_RETURN(bool row, ins.Step());
    if (!row) return Status::Internal("INSERT of a program returned no id");
    rec->program_id = ins.Int(0);
    COV_RETURN_IF_ERROR(ins.Reset());
    rec->calls = rec->cases = rec->unsupported_calls = 0;
    if (program == nullptr) return Status::Ok();

    COV_ASSIGN_OR_RETURN(auto value, db_->Prepare(
        "INSERT INTO program_values(program_id, value_id, kind, name, tensor_json, init_json, scalar_json, "
        "unsupported) VALUES (?1, ?2, ?3, ?4, ?5, NULLIF(?6, ''), NULLIF(?7, ''), NULLIF(?8, ''))"));
    for (const ProgramValue& v : program->values) {
      value.Bind(1, rec->program_id).Bind(2, v.id).Bind(3, v.kind).Bind(4, v.name);
      if (v.tensor) {
        value.Bind(5, v.tensor->ToJson());
      } else {
        value.BindNull(5);
      }
      value.Bind(6, v.init.is_null() ? std::string() : DumpJson(v.init));
      value.Bind(7, v.scalar.is_null() ? std::string() : DumpJson(v.scalar)).Bind(8, v.unsupported);
      COV_RETURN_IF_ERROR(value.Run().WithContext(fmt::format("value {}", v.id)));
    }
    COV_ASSIGN_OR_RETURN(auto call, db_->Prepare(
        "INSERT INTO program_calls(program_id, call_index, case_id, op, overload, inputs, outputs, module, phase, "
        "unsupported, decomposition) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, NULLIF(?10, ''), NULLIF(?11, ''))"));
    std::unordered_map<std::string, int64_t> case_ids;  // key -> case_id
    struct Source {
      int64_t count = 0;
      int64_t first = 0;
    };
    std::map<std::pair<int64_t, std::string>, Source> sources;  // (case_id, module)
    for (const ProgramCall& c : program->calls) {
      call.Bind(1, rec->program_id).Bind(2, c.index);
      if (c.op_case) {
        const std::string key = c.op_case->Key();
        auto it = case_ids.find(key);
        if (it == case_ids.end()) {
          const CostEstimate cost = EstimateCost(*c.op_case, c.output_specs);
          COV_ASSIGN_OR_RETURN(int64_t id, UpsertCase(*c.op_case, {cost.flops, cost.bytes}));
          it = case_ids.emplace(key, id).first;
        }
        call.Bind(3, it->second);
        auto [src, inserted] = sources.try_emplace({it->second, c.module}, Source{0, c.index});
        ++src->second.count;
      } else {
        call.BindNull(3);
        ++rec->unsupported_calls;
      }
      call.Bind(4, c.op).Bind(5, c.overload).Bind(6, IdsJson(c.inputs)).Bind(7, IdsJson(c.outputs));
      call.Bind(8, c.module).Bind(9, c.phase).Bind(10, c.unsupported)
          .Bind(11, c.decomposition.empty() ? std::string() : nlohmann::json(c.decomposition).dump());
      COV_RETURN_IF_ERROR(call.Run().WithContext(fmt::format("call {} ({})", c.index, c.op)));
    }
    COV_ASSIGN_OR_RETURN(auto source, db_->Prepare(
        "INSERT INTO case_sources(case_id, model_id, module_path, call_site, profile, depth, call_count, first_call) "
        "VALUES (?1, ?2, ?3, '', ?4, 0, ?5, ?6)"));
    for (const auto& [where, src] : sources) {
      source.Bind(1, where.first).Bind(2, rec->model_id).Bind(3, where.second).Bind(4, rec->profile);
      source.Bind(5, src.count).Bind(6, src.first);
      COV_RETURN_IF_ERROR(source.Run());
    }
    rec->calls = static_cast<int64_t>(program->calls.size());
    rec->cases = static_cast<int64_t>(case_ids.size());
    COV_ASSIGN_OR_RETURN(auto counts, db_->Prepare(
        "UPDATE programs SET calls = ?2, cases = ?3, unsupported_calls = ?4 WHERE program_id = ?1"));
    counts.Bind(1, rec->program_id).Bind(2, rec->calls).Bind(3, rec->cases).Bind(4, rec->unsupported_calls);
    return counts.Run();
  });
  return s.WithContext(fmt::format("storing the program of {} / {} in {}", rec->model_id, rec->profile, db_->path()));
}

Result<std::optional<ProgramRecord>> Registry::GetProgramRecord(const std::string& model_id,
                                                                const std::string& profile) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(fmt::format(
                                      "SELECT {} FROM programs WHERE model_id = ?1 AND profile = ?2", kProgramColumns)));
  stmt.Bind(1, model_id).Bind(2, profile);
  COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
  if (!row) return std::optional<ProgramRecord>();
  return std::optional<ProgramRecord>(ReadProgramRow(stmt));
}

Result<std::vector<ProgramRecord>> Registry::ListPrograms(const std::string& model_id) {
  COV_ASSIGN_OR_RETURN(auto stmt, db_->Prepare(fmt::format(
                                      "SELECT {} FROM programs WHERE ?1 = '' OR model_id = ?1 ORDER BY model_id, profile",
                                      kProgramColumns)));
  stmt.Bind(1, model_id);
  std::vector<ProgramRecord> out;
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back(ReadProgramRow(stmt));
  }
  return out;
}

Result<std::optional<Program>> Registry::LoadProgram(const std::string& model_id, const std::string& profile) {
  COV_ASSIGN_OR_RETURN(auto rec, GetProgramRecord(model_id, profile));
  if (!rec || rec->status != "captured") return std::optional<Program>();
  Program p;
  p.info = rec->info;
  // Value ids count up in the order values were first read.
  COV_ASSIGN_OR_RETURN(auto vstmt, db_->Prepare(
      "SELECT value_id, kind, name, tensor_json, COALESCE(init_json, ''), COALESCE(scalar_json, ''), "
      "COALESCE(unsupported, '') FROM program_values WHERE program_id = ?1 ORDER BY value_id"));
  vstmt.Bind(1, rec->program_id);
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, vstmt.Step());
    if (!row) break;
    ProgramValue v;
    v.id = vstmt.Int(0);
    v.kind = vstmt.Text(1);
    v.name = vstmt.Text(2);
    if (!vstmt.IsNull(3)) {
      COV_ASSIGN_OR_RETURN(TensorSpec t, TensorSpec::FromJson(vstmt.Text(3), fmt::format("value {}", v.id)));
      v.tensor = std::move(t);
    }
    // The init and scalar records, parsed once here (Note [Program replay]).
    for (auto [column, member, name] : {std::tuple{4, &v.init, "init"}, std::tuple{5, &v.scalar, "scalar"}}) {
      const std::string text = vstmt.Text(column);
      if (text.empty()) continue;
      *member = nlohmann::json::parse(text, nullptr, false);
      if (member->is_discarded()) {
        return Status::Corruption(fmt::format("{}: program of {} / {}, value {}: its {} record is not JSON",
                                              db_->path(), model_id, profile, v.id, name));
      }
    }
    v.unsupported = vstmt.Text(6);
    p.values.push_back(std::move(v));
  }
  COV_ASSIGN_OR_RETURN(auto cstmt, db_->Prepare(
      "SELECT pc.call_index, pc.op, pc.overload, c.case_json, pc.inputs, pc.outputs, pc.module, pc.phase, "
      "COALESCE(pc.unsupported, ''), COALESCE(pc.decomposition, '') FROM program_calls pc LEFT JOIN op_cases c ON c.case_id = pc.case_id "
      "WHERE pc.program_id = ?1 ORDER BY pc.call_index"));
  cstmt.Bind(1, rec->program_id);
  for (;;) {
    COV_ASSIGN_OR_RETURN(bool row, cstmt.Step());
    if (!row) break;
    ProgramCall c;
    c.index = cstmt.Int(0);
    const std::string what = fmt::format("program {} / {}, call {}", model_id, profile, c.index);
    c.op = cstmt.Text(1);
    c.overload = cstmt.Text(2);
    if (!cstmt.IsNull(3)) {
      COV_ASSIGN_OR_RETURN(OpCase oc, OpCase::FromJson(cstmt.Text(3)));
      c.op_case = std::move(oc);
    }
    COV_ASSIGN_OR_RETURN(c.inputs, IdsFromJson(cstmt.Text(4), what + " inputs"));
    COV_ASSIGN_OR_RETURN(c.outputs, IdsFromJson(cstmt.Text(5), what + " outputs"));
    c.module = cstmt.Text(6);
    c.phase = cstmt.Text(7);
    c.unsupported = cstmt.Text(8);
    if (!cstmt.Text(9).empty()) {
      const auto names = nlohmann::json::parse(cstmt.Text(9), nullptr, false);
      if (!names.is_array()) return Status::Corruption(what + ": decomposition is not a JSON array");
      for (const auto& n : names) {
        if (!n.is_string()) return Status::Corruption(what + ": decomposition holds a non-string");
        c.decomposition.push_back(n.get<std::string>());
      }
    }
    p.calls.push_back(std::move(c));
  }
  return std::optional<Program>(std::move(p));
}

}  // namespace coverage::registry

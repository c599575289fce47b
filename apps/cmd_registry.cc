// `coverage registry stats | query | export | programs`: the shape registry, queried.
#include <cstdio>
#include <fstream>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/app.h"
#include "core/output_file.h"
#include "apps/flags.h"
#include "apps/table.h"
#include "registry/registry.h"

namespace coverage::apps {
namespace {

struct FilterFlags {
  std::vector<std::string> ops;
  std::string model;
  std::string dtype;
  std::vector<std::string> dims;
  std::optional<double> min_flops;
  std::optional<double> max_flops;
  std::string profile;
  std::string source;
  int64_t limit = 0;
  std::string format = "table";
  std::string out;
  int top = 20;
};

void AddFilterFlags(CLI::App* cmd, FilterFlags& f) {
  cmd->add_option("--op", f.ops, "Op name, e.g. mm, aten::addmm or add.Tensor (repeatable: any of them)");
  cmd->add_option("--model", f.model, "Source model id; * and ? are wildcards (e.g. 'Qwen/*')");
  cmd->add_option("--dtype", f.dtype, "A tensor argument has this dtype (f32, bf16, f16, f64, i64, b8, ...)");
  cmd->add_option("--dim", f.dims,
                  "Dimension predicate, ARG[IDX] OP N or ARG.rank OP N; ARG is a tensor argument's name or * "
                  "(items of tensor lists are not matched); e.g. "
                  "'self[-1]>=4096', '*.rank==4' (repeatable: all must hold)");
  cmd->add_option("--min-flops", f.min_flops, "Estimated FLOPs at least")->check(FiniteRange(0, 1e30));
  cmd->add_option("--max-flops", f.max_flops, "Estimated FLOPs at most")->check(FiniteRange(0, 1e30));
  cmd->add_option("--profile", f.profile, "Captured under this input profile (prefill, decode, ...)");
  cmd->add_option("--source", f.source,
                  "captured (from a model) or opinfo (from an OpInfo sample, `coverage import opinfo`)")
      ->check(CLI::IsMember({"captured", "opinfo"}));
}

Result<registry::CaseFilter> ToFilter(const FilterFlags& f) {
  registry::CaseFilter filter;
  filter.ops = f.ops;
  filter.model = f.model;
  if (!f.dtype.empty() && !DTypeFromName(f.dtype)) {
    return Status::InvalidArgument("--dtype '" + f.dtype + "' is not a dtype (f32 f64 f16 bf16 i8 u8 i16 i32 i64 b8 c64 c128)");
  }
  filter.dtype = f.dtype;
  for (const auto& d : f.dims) {
    COV_ASSIGN_OR_RETURN(auto p, registry::ParseDimPredicate(d));
    filter.dims.push_back(std::move(p));
  }
  filter.min_flops = f.min_flops;
  filter.max_flops = f.max_flops;
  filter.profile = f.profile;
  filter.source = f.source;
  filter.limit = f.limit;
  return filter;
}

std::string HumanCount(double v) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (std::abs(v) >= 1000 && u < 5) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f}", v) : fmt::format("{:.1f}{}", v, units[u]);
}

Status WriteOutput(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return Status::Ok();
  }
  return WriteOutputFile(path, text);
}

Result<OutputFormat> ParseFormat(const std::string& f) {
  if (f == "table") return OutputFormat::kTable;
  if (f == "json") return OutputFormat::kJson;
  if (f == "csv") return OutputFormat::kCsv;
  return Status::InvalidArgument("--format '" + f + "': expected table, json or csv");
}

std::string Render(const Table& t, OutputFormat format, size_t max_width = 0) {
  switch (format) {
    case OutputFormat::kJson: return t.RenderJson();
    case OutputFormat::kCsv: return t.RenderCsv();
    case OutputFormat::kTable: return t.RenderAligned(max_width);
  }
  return "";
}

// The cases matching the flags' filters, read-only.
Result<std::vector<registry::StoredCase>> LoadCases(const GlobalOptions& global, const FilterFlags& flags) {
  COV_ASSIGN_OR_RETURN(auto filter, ToFilter(flags));
  COV_ASSIGN_OR_RETURN(auto reg, OpenRegistry(global, true));
  return reg->FindCases(filter);
}

// "a/b,c/d" (a StoredCase's models column) -> {"a/b", "c/d"}.
std::vector<std::string> SplitModels(const std::string& models) {
  std::vector<std::string> out;
  size_t start = 0;
  while (!models.empty()) {
    size_t comma = models.find(',', start);
    out.push_back(models.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int RunQuery(const GlobalOptions& global, const FilterFlags& flags) {
  auto format = ParseFormat(flags.format);
  if (!format) return ReportError(format.error());
  auto cases = LoadCases(global, flags);
  if (!cases) return ReportError(cases.error());
  Table t;
  const bool human = *format == OutputFormat::kTable;
  t.headers = {"key", "op", "case", "flops", "models", "calls"};
  t.numeric = {false, false, false, true, true, true};
  for (const auto& c : *cases) {
    std::string summary = c.op_case.Summary();
    summary = summary.substr(c.op_case.QualifiedName().size());
    t.rows.push_back({c.key, c.op_case.QualifiedName(), summary,
                      human ? HumanCount(c.cost.flops) : fmt::format("{:.0f}", c.cost.flops),
                      std::to_string(SplitModels(c.models).size()), std::to_string(c.total_calls)});
  }
  Status s = WriteOutput(flags.out, Render(t, *format, 110));
  if (!s.ok()) return ReportError(s);
  if (human && flags.out.empty()) std::fprintf(stderr, "%zu cases\n", cases->size());
  return kExitOk;
}

int RunExport(const GlobalOptions& global, const FilterFlags& flags) {
  if (flags.format != "jsonl" && flags.format != "json" && flags.format != "csv") {
    return ReportError(Status::InvalidArgument("--format '" + flags.format + "': expected jsonl, json or csv"));
  }
  auto cases = LoadCases(global, flags);
  if (!cases) return ReportError(cases.error());
  std::string text;
  if (flags.format == "csv") {
    Table t;
    t.headers = {"key", "op", "overload", "summary", "flops", "bytes", "models", "calls", "case_json"};
    for (const auto& c : *cases) {
      t.rows.push_back({c.key, c.op_case.op, c.op_case.overload, c.op_case.Summary(), fmt::format("{:.0f}", c.cost.flops),
                        fmt::format("{:.0f}", c.cost.bytes), c.models, std::to_string(c.total_calls),
                        c.op_case.ToCanonicalJson()});
    }
    text = t.RenderCsv();
  } else {
    nlohmann::json all = nlohmann::json::array();
    for (const auto& c : *cases) {
      nlohmann::json j = {{"key", c.key},
                          {"summary", c.op_case.Summary()},
                          {"case", nlohmann::json::parse(c.op_case.ToCanonicalJson())},
                          {"flops", c.cost.flops},
                          {"bytes", c.cost.bytes},
                          {"models", SplitModels(c.models)},
                          {"calls", c.total_calls}};
      if (flags.format == "jsonl") {
        text += j.dump() + "\n";
      } else {
        all.push_back(std::move(j));
      }
    }
    if (flags.format == "json") text = all.dump(2) + "\n";
  }
  Status s = WriteOutput(flags.out, text);
  if (!s.ok()) return ReportError(s);
  if (!flags.out.empty() && flags.out != "-") std::fprintf(stderr, "wrote %zu cases to %s\n", cases->size(), flags.out.c_str());
  return kExitOk;
}

int RunStats(const GlobalOptions& global, const FilterFlags& flags) {
  auto format = ParseFormat(flags.format);
  if (!format) return ReportError(format.error());
  auto cases = LoadCases(global, flags);
  if (!cases) return ReportError(cases.error());

  struct OpStats {
    int64_t cases = 0, calls = 0;
    int64_t captured = 0, opinfo = 0;  // cases by source (a case may have both)
    double flops = 0;
    std::set<std::string> models;
  };
  std::map<std::string, OpStats> per_op;
  std::map<std::string, int64_t> per_dtype, per_model;
  double total_flops = 0;
  int64_t total_calls = 0;
  int64_t captured = 0, opinfo = 0, both = 0;
  for (const auto& c : *cases) {
    OpStats& s = per_op[c.op_case.QualifiedName()];
    ++s.cases;
    const bool from_model = c.num_sources > 0, from_opinfo = c.opinfo_samples > 0;
    s.captured += from_model;
    s.opinfo += from_opinfo;
    captured += from_model;
    opinfo += from_opinfo;
    both += from_model && from_opinfo;
    s.calls += c.total_calls;
    s.flops += c.cost.flops;
    total_flops += c.cost.flops;
    total_calls += c.total_calls;
    for (DType d : c.op_case.DTypes()) ++per_dtype[std::string(DTypeName(d))];
    for (const std::string& m : SplitModels(c.models)) {
      s.models.insert(m);
      ++per_model[m];
    }
  }
  std::vector<std::pair<std::string, OpStats>> ops(per_op.begin(), per_op.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.cases > b.second.cases; });

  Table op_table;
  op_table.headers = {"op", "cases", "captured", "opinfo", "models", "calls", "flops"};
  op_table.numeric = {false, true, true, true, true, true, true};
  const bool human = *format == OutputFormat::kTable;
  for (size_t i = 0; i < ops.size() && (flags.top <= 0 || static_cast<int>(i) < flags.top || !human); ++i) {
    const auto& [name, s] = ops[i];
    op_table.rows.push_back({name, std::to_string(s.cases), std::to_string(s.captured), std::to_string(s.opinfo),
                             std::to_string(s.models.size()), std::to_string(s.calls),
                             human ? HumanCount(s.flops) : fmt::format("{:.0f}", s.flops)});
  }
  Table dtype_table;
  dtype_table.headers = {"dtype", "cases"};
  dtype_table.numeric = {false, true};
  for (const auto& [d, n] : per_dtype) dtype_table.rows.push_back({d, std::to_string(n)});
  Table model_table;
  model_table.headers = {"model", "cases"};
  model_table.numeric = {false, true};
  for (const auto& [m, n] : per_model) model_table.rows.push_back({m, std::to_string(n)});

  std::string text;
  if (*format == OutputFormat::kJson) {
    nlohmann::json j = {{"registry", global.registry_path},
                        {"cases", cases->size()},
                        {"ops", per_op.size()},
                        {"models", per_model.size()},
                        {"calls", total_calls},
                        {"flops", total_flops},
                        {"per_source", {{"captured", captured}, {"opinfo", opinfo}, {"both", both}}},
                        {"per_op", nlohmann::json::parse(op_table.RenderJson())},
                        {"per_dtype", nlohmann::json::parse(dtype_table.RenderJson())},
                        {"per_model", nlohmann::json::parse(model_table.RenderJson())}};
    text = j.dump(2) + "\n";
  } else if (*format == OutputFormat::kCsv) {
    text = op_table.RenderCsv();
  } else {
    text = fmt::format("registry {}: {} cases of {} ops from {} models ({} calls, {} FLOPs)\n\n", global.registry_path,
                       cases->size(), per_op.size(), per_model.size(), total_calls, HumanCount(total_flops));
    text += fmt::format("sources: {} captured from models, {} from OpInfo samples ({} from both)\n\n", captured,
                        opinfo, both);
    text += op_table.RenderAligned();
    if (flags.top > 0 && static_cast<int>(ops.size()) > flags.top) {
      text += fmt::format("... {} more ops (--top 0 shows all)\n", ops.size() - flags.top);
    }
    text += "\n" + dtype_table.RenderAligned() + "\n" + model_table.RenderAligned();
  }
  Status s = WriteOutput(flags.out, text);
  return s.ok() ? kExitOk : ReportError(s);
}

struct ProgramFlags {
  std::string model;
  std::string profile;
  bool calls = false;
  std::string format = "table";
  std::string out;
};

// `registry programs`: what the tracer did per (model, profile); with
// --calls, one program call by call.
int RunPrograms(const GlobalOptions& global, const ProgramFlags& flags) {
  auto format = ParseFormat(flags.format);
  if (!format) return ReportError(format.error());
  auto reg = OpenRegistry(global, true);
  if (!reg) return ReportError(reg.error());
  Table t;
  if (flags.calls) {
    if (flags.model.empty() || flags.profile.empty()) {
      return ReportError(Status::InvalidArgument("--calls prints one program: give --model and --profile"));
    }
    auto program = (*reg)->LoadProgram(flags.model, flags.profile);
    if (!program) return ReportError(program.error());
    if (!*program) {
      return ReportError(Status::NotFound(fmt::format("no captured program of '{}' / '{}' in {} (coverage registry "
                                                      "programs lists them)",
                                                      flags.model, flags.profile, global.registry_path)));
    }
    t.headers = {"index", "phase", "module", "call", "reads", "writes"};
    t.numeric = {true, false, false, false, false, false};
    for (const auto& c : (*program)->calls) {
      std::string call = c.op_case ? c.op_case->Summary() : c.op + " (" + c.unsupported + ")";
      t.rows.push_back({std::to_string(c.index), c.phase, c.module, call, fmt::format("{}", fmt::join(c.inputs, ",")),
                        fmt::format("{}", fmt::join(c.outputs, ","))});
    }
  } else {
    auto rows = (*reg)->ListPrograms(flags.model);
    if (!rows) return ReportError(rows.error());
    t.headers = {"model", "profile", "status", "device", "calls", "cases", "seconds", "reason"};
    t.numeric = {false, false, false, false, true, true, true, false};
    for (const auto& r : *rows) {
      if (!flags.profile.empty() && r.profile != flags.profile) continue;
      t.rows.push_back({r.model_id, r.profile, r.status, r.info.device, std::to_string(r.calls),
                        std::to_string(r.cases), fmt::format("{:.1f}", r.seconds),
                        r.stage.empty() ? r.reason : r.stage + ": " + r.reason});
    }
  }
  Status s = WriteOutput(flags.out, Render(t, *format, 140));
  return s.ok() ? kExitOk : ReportError(s);
}

}  // namespace

void AddRegistryCommand(CLI::App& app, GlobalOptions& global) {
  CLI::App* reg = app.add_subcommand("registry", "Query the shape registry: stats, query, export, programs");
  reg->require_subcommand(1);

  auto stats_flags = std::make_shared<FilterFlags>();
  CLI::App* stats = reg->add_subcommand("stats", "Counts of cases per op, source, dtype and source model");
  AddFilterFlags(stats, *stats_flags);
  stats->add_option("--format", stats_flags->format, "table, json or csv (the per-op table)")->capture_default_str();
  stats->add_option("--top", stats_flags->top, "Ops shown in the table (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000000));
  stats->add_option("-o,--out", stats_flags->out, "Write to this file instead of stdout");
  stats->callback([&global, stats_flags]() { global.exit_code = RunStats(global, *stats_flags); });

  auto query_flags = std::make_shared<FilterFlags>();
  CLI::App* query = reg->add_subcommand("query", "List op cases matching the filters");
  AddFilterFlags(query, *query_flags);
  query->add_option("--limit", query_flags->limit, "At most this many cases (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  query->add_option("--format", query_flags->format, "table, json or csv")->capture_default_str();
  query->add_option("-o,--out", query_flags->out, "Write to this file instead of stdout");
  query->callback([&global, query_flags]() { global.exit_code = RunQuery(global, *query_flags); });

  auto export_flags = std::make_shared<FilterFlags>();
  export_flags->format = "jsonl";
  CLI::App* exp = reg->add_subcommand("export", "Export op cases with their full JSON and provenance");
  AddFilterFlags(exp, *export_flags);
  exp->add_option("--limit", export_flags->limit, "At most this many cases (0 = all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  exp->add_option("--format", export_flags->format, "jsonl, json or csv")->capture_default_str();
  exp->add_option("-o,--out", export_flags->out, "Write to this file instead of stdout");
  exp->callback([&global, export_flags]() { global.exit_code = RunExport(global, *export_flags); });

  auto program_flags = std::make_shared<ProgramFlags>();
  CLI::App* programs = reg->add_subcommand(
      "programs", "Captured programs per (model, profile): status, device, calls, cases, or why not captured");
  programs->add_option("--model", program_flags->model, "Only this model id");
  programs->add_option("--profile", program_flags->profile, "Only this profile");
  programs->add_flag("--calls", program_flags->calls,
                     "Print one program (--model and --profile) call by call: phase, module, op case, value ids");
  programs->add_option("--format", program_flags->format, "table, json or csv")->capture_default_str();
  programs->add_option("-o,--out", program_flags->out, "Write to this file instead of stdout");
  programs->callback([&global, program_flags]() { global.exit_code = RunPrograms(global, *program_flags); });
}

}  // namespace coverage::apps

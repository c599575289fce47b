#include "capture/trace_reader.h"
#include "core/text_safety.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "core/json_fields.h"

namespace coverage::capture {
namespace {

using json = nlohmann::json;

Result<ValueDomain> DomainFromJson(const JsonFields& d) {
  std::string kind;
  COV_RETURN_IF_ERROR(d.RequiredString("kind", &kind));
  ValueDomain out;
  static constexpr std::pair<ValueDomain::Kind, std::string_view> kKinds[] = {
      {ValueDomain::Kind::kReal, "real"},     {ValueDomain::Kind::kNonNegative, "non_negative"},
      {ValueDomain::Kind::kPositive, "positive"}, {ValueDomain::Kind::kUnit, "unit"},
      {ValueDomain::Kind::kMask, "mask"},     {ValueDomain::Kind::kInteger, "integer"},
      {ValueDomain::Kind::kBool, "bool"},     {ValueDomain::Kind::kConstant, "constant"},
  };
  bool found = false;
  for (auto [k, name] : kKinds) {
    if (name == kind) {
      out.kind = k;
      found = true;
    }
  }
  if (!found) return d.Error("kind", "unknown domain '" + kind + "'");
  if (out.kind == ValueDomain::Kind::kInteger) {
    COV_RETURN_IF_ERROR(d.RequiredInt("lo", &out.lo));
    COV_RETURN_IF_ERROR(d.RequiredInt("hi", &out.hi));
    if (out.hi <= out.lo) return Status::Corruption(fmt::format("{}: empty range [{}, {})", d.what(), out.lo, out.hi));
  }
  if (out.kind == ValueDomain::Kind::kConstant) COV_RETURN_IF_ERROR(d.RequiredDouble("value", &out.value));
  return out;
}

// SPEC, plus the DOMAIN beside it in `holder` (absent: real).
Result<TensorSpec> SpecFromJson(const JsonFields& holder) {
  const json* tensor = holder.Find("tensor");
  if (!tensor || !tensor->is_object()) return holder.Error("tensor", "missing");
  COV_ASSIGN_OR_RETURN(TensorSpec spec, TensorLayoutFromJson(holder.Sub("tensor", *tensor), "storage_offset",
                                                             /*offset_required=*/true));
  if (const json* dom = holder.Find("domain")) {
    COV_ASSIGN_OR_RETURN(spec.domain, DomainFromJson(holder.Sub("domain", *dom)));
  } else if (spec.dtype == DType::kBool) {
    spec.domain.kind = ValueDomain::Kind::kBool;  // as the C++ observer describes every bool tensor
  }
  return spec;
}

// One ARG of a call: fills `arg` and appends tensor value ids to `inputs`.
Status ArgFromJson(const json& j, const std::string& what, Argument* arg, std::vector<int64_t>* inputs) {
  std::string kind;
  {
    const JsonFields f(j, what);
    COV_RETURN_IF_ERROR(f.RequiredString("name", &arg->name));
    COV_RETURN_IF_ERROR(f.RequiredString("kind", &kind));
  }
  const JsonFields f(j, what + " (" + arg->name + ")");
  if (kind == "none") {
    arg->kind = Argument::Kind::kNone;
  } else if (kind == "device") {
    arg->kind = Argument::Kind::kDevice;
  } else if (kind == "tensor") {
    arg->kind = Argument::Kind::kTensor;
    int64_t id = 0;
    COV_RETURN_IF_ERROR(f.RequiredInt("value", &id));
    COV_ASSIGN_OR_RETURN(arg->tensor, SpecFromJson(f));
    inputs->push_back(id);
  } else if (kind == "tensor_list") {
    arg->kind = Argument::Kind::kTensorList;
    const json* items = f.Find("items");
    if (!items || !items->is_array()) return f.Error("items", "missing");
    for (size_t i = 0; i < items->size(); ++i) {
      const json& item = (*items)[i];
      if (item.is_null()) {
        arg->tensors.emplace_back(std::nullopt);
        inputs->push_back(-1);
        continue;
      }
      const JsonFields at(item, fmt::format("{}.items[{}]", f.what(), i));
      int64_t id = 0;
      COV_RETURN_IF_ERROR(at.RequiredInt("value", &id));
      COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(at));
      arg->tensors.emplace_back(std::move(spec));
      inputs->push_back(id);
    }
  } else if (kind == "int") {
    arg->kind = Argument::Kind::kInt;
    COV_RETURN_IF_ERROR(f.RequiredInt("i", &arg->i));
  } else if (kind == "double") {
    arg->kind = Argument::Kind::kDouble;
    COV_RETURN_IF_ERROR(f.RequiredDouble("d", &arg->d));
  } else if (kind == "bool") {
    arg->kind = Argument::Kind::kBool;
    COV_RETURN_IF_ERROR(f.Require("b"));
    COV_RETURN_IF_ERROR(f.Bool("b", &arg->b));
  } else if (kind == "string") {
    arg->kind = Argument::Kind::kString;
    COV_RETURN_IF_ERROR(f.RequiredString("s", &arg->s));
  } else if (kind == "int_list") {
    arg->kind = Argument::Kind::kIntList;
    COV_RETURN_IF_ERROR(f.Require("ints"));
    COV_RETURN_IF_ERROR(f.Ints("ints", &arg->ints));
  } else if (kind == "double_list") {
    arg->kind = Argument::Kind::kDoubleList;
    COV_RETURN_IF_ERROR(f.Require("doubles"));
    COV_RETURN_IF_ERROR(f.Doubles("doubles", &arg->doubles));
  } else if (kind == "bool_list") {
    arg->kind = Argument::Kind::kBoolList;
    COV_RETURN_IF_ERROR(f.Require("bools"));
    COV_RETURN_IF_ERROR(f.Bools("bools", &arg->bools));
  } else {
    return f.Error("kind", "unknown argument kind '" + kind + "'");
  }
  return Status::Ok();
}

std::string DumpOrEmpty(const json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? std::string() : DumpJson(*it);
}

}  // namespace

Status TraceReader::Feed(std::string_view line) {
  ++line_no_;
  const std::string what = fmt::format("tracer output line {}", line_no_);
  json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    // Note [Terminal-safe text]: whatever a broken tracer printed, shown as text.
    return Status::Corruption(fmt::format("{}: not a JSON record: {}", what, TerminalSafe(line, 120)));
  }
  const JsonFields f(j, what);
  std::string type;
  COV_RETURN_IF_ERROR(f.RequiredString("type", &type));
  if (ended_ || error_) return Status::Corruption(fmt::format("{}: a '{}' record after the last record", what, type));
  if (type == "error") {
    TraceError e;
    COV_RETURN_IF_ERROR(f.RequiredString("stage", &e.stage));
    COV_RETURN_IF_ERROR(f.RequiredString("reason", &e.reason));
    COV_RETURN_IF_ERROR(f.String("exception", &e.exception));
    error_ = std::move(e);
    return Status::Ok();
  }
  if (type == "start") {
    if (started_) return Status::Corruption(what + ": a second 'start' record");
    ProgramInfo& info = program_.info;
    int64_t version = 0;
    COV_RETURN_IF_ERROR(f.RequiredInt("tracer_version", &version));
    if (version < kOldestTracerVersionRead || version > kTracerVersion) {
      return Status::Unsupported(fmt::format("{}: tracer_version {} but this build reads versions {} to {}", what,
                                             version, kOldestTracerVersionRead, kTracerVersion));
    }
    info.tracer_version = static_cast<int>(version);
    COV_RETURN_IF_ERROR(f.RequiredString("model", &info.model_id));
    COV_RETURN_IF_ERROR(f.RequiredString("profile", &info.profile));
    COV_RETURN_IF_ERROR(f.RequiredString("class", &info.class_name));
    COV_RETURN_IF_ERROR(f.String("model_type", &info.model_type));
    COV_RETURN_IF_ERROR(f.RequiredString("kind", &info.kind));
    COV_RETURN_IF_ERROR(f.RequiredString("device", &info.device));
    COV_RETURN_IF_ERROR(f.String("attn_implementation", &info.attn_implementation));
    COV_RETURN_IF_ERROR(f.String("dtype", &info.dtype));
    COV_RETURN_IF_ERROR(f.String("torch", &info.torch_version));
    COV_RETURN_IF_ERROR(f.String("transformers", &info.transformers_version));
    info.layers_json = DumpOrEmpty(j, "layers");
    if (info.layers_json.empty()) info.layers_json = "{}";
    info.fallback = DumpOrEmpty(j, "fallback");
    COV_RETURN_IF_ERROR(f.Double("estimated_gb", &info.estimated_gb));
    started_ = true;
    return Status::Ok();
  }
  if (!started_) return Status::Corruption(fmt::format("{}: a '{}' record before 'start'", what, type));
  if (type == "value") {
    ProgramValue v;
    COV_RETURN_IF_ERROR(f.RequiredInt("id", &v.id));
    COV_RETURN_IF_ERROR(f.RequiredString("kind", &v.kind));
    COV_RETURN_IF_ERROR(f.String("name", &v.name));
    COV_RETURN_IF_ERROR(f.String("unsupported", &v.unsupported));
    if (v.unsupported.empty()) {
      COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(f));
      v.tensor = std::move(spec);
    }
    if (auto init = j.find("init"); init != j.end()) v.init = *init;
    if (auto scalar = j.find("scalar"); scalar != j.end()) v.scalar = *scalar;
    program_.values.push_back(std::move(v));
    return Status::Ok();
  }
  if (type == "call") {
    ProgramCall c;
    COV_RETURN_IF_ERROR(f.RequiredInt("index", &c.index));
    if (c.index != static_cast<int64_t>(program_.calls.size())) {
      return Status::Corruption(
          fmt::format("{}: call index {} where {} was expected", what, c.index, program_.calls.size()));
    }
    COV_RETURN_IF_ERROR(f.RequiredString("op", &c.op));
    COV_RETURN_IF_ERROR(f.String("overload", &c.overload));
    COV_RETURN_IF_ERROR(f.String("module", &c.module));
    COV_RETURN_IF_ERROR(f.RequiredString("phase", &c.phase));
    COV_RETURN_IF_ERROR(f.String("unsupported", &c.unsupported));
    const std::string here = fmt::format("{} ({})", what, c.op);
    const JsonFields call(j, here);
    COV_RETURN_IF_ERROR(call.Strings("decomposition", &c.decomposition));
    if (c.unsupported.empty()) {
      auto args = j.find("args");
      if (args == j.end() || !args->is_array()) return Status::Corruption(here + ": missing 'args'");
      OpCase oc;
      oc.op = c.op;
      oc.overload = c.overload;
      for (size_t i = 0; i < args->size(); ++i) {
        Argument a;
        COV_RETURN_IF_ERROR(ArgFromJson((*args)[i], fmt::format("{}.args[{}]", here, i), &a, &c.inputs));
        oc.args.push_back(std::move(a));
      }
      c.op_case = std::move(oc);
    }
    auto outputs = j.find("outputs");
    if (outputs == j.end() || !outputs->is_array()) return Status::Corruption(here + ": missing 'outputs'");
    for (size_t i = 0; i < outputs->size(); ++i) {
      const json& o = (*outputs)[i];
      const std::string at = fmt::format("{}.outputs[{}]", here, i);
      if (!o.is_object()) return Status::Corruption(at + ": expected an object");
      if (!o.contains("value")) {
        c.outputs.push_back(-1);  // a returned number, bool or undefined tensor
        continue;
      }
      const JsonFields out(o, at);
      int64_t id = 0;
      COV_RETURN_IF_ERROR(out.RequiredInt("value", &id));
      c.outputs.push_back(id);
      if (o.contains("tensor")) {
        COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(out));
        c.output_specs.push_back(std::move(spec));
      }
    }
    program_.calls.push_back(std::move(c));
    return Status::Ok();
  }
  if (type == "end") {
    int64_t calls = 0;
    COV_RETURN_IF_ERROR(f.RequiredInt("calls", &calls));
    if (calls != static_cast<int64_t>(program_.calls.size())) {
      return Status::Corruption(
          fmt::format("{}: the end record counts {} calls but {} were read", what, calls, program_.calls.size()));
    }
    COV_RETURN_IF_ERROR(f.RequiredInt("values", &program_.info.value_count));
    COV_RETURN_IF_ERROR(f.Double("seconds", &program_.info.seconds));
    COV_RETURN_IF_ERROR(f.Double("peak_rss_mb", &program_.info.peak_rss_mb));
    ended_ = true;
    return Status::Ok();
  }
  return Status::Corruption(fmt::format("{}: unknown record type '{}'", what, type));
}

Result<TraceOutcome> TraceReader::Finish() {
  TraceOutcome out;
  if (error_) {
    out.error = std::move(error_);
    return out;
  }
  if (!started_) return Status::Corruption("the tracer wrote no records");
  if (!ended_) {
    return Status::Corruption(fmt::format("the tracer's output ends after {} calls without an 'end' record",
                                          program_.calls.size()));
  }
  out.program = std::move(program_);
  return out;
}

}  // namespace coverage::capture

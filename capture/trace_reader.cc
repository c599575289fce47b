#include "capture/trace_reader.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/json_double.h"

namespace coverage::capture {
namespace {

using json = nlohmann::json;

// Field readers: a missing field or a wrong type is an error naming it.
Result<std::string> Str(const json& j, const char* key, const std::string& what, bool required = true) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (!required) return std::string();
    return Status::Corruption(fmt::format("{}: missing '{}'", what, key));
  }
  if (!it->is_string()) return Status::Corruption(fmt::format("{}.{}: expected a string", what, key));
  return it->get<std::string>();
}

Result<int64_t> Int(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Corruption(fmt::format("{}: missing '{}'", what, key));
  if (!it->is_number_integer()) return Status::Corruption(fmt::format("{}.{}: expected an integer", what, key));
  return it->get<int64_t>();
}

double Num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

Result<std::vector<int64_t>> Ints(const json& j, const std::string& what) {
  if (!j.is_array()) return Status::Corruption(what + ": expected an array of integers");
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer()) return Status::Corruption(what + ": expected integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

Result<ValueDomain> DomainFromJson(const json& d, const std::string& what) {
  if (!d.is_object()) return Status::Corruption(what + ": expected an object");
  COV_ASSIGN_OR_RETURN(std::string kind, Str(d, "kind", what));
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
  if (!found) return Status::Corruption(fmt::format("{}.kind: unknown domain '{}'", what, kind));
  if (out.kind == ValueDomain::Kind::kInteger) {
    COV_ASSIGN_OR_RETURN(out.lo, Int(d, "lo", what));
    COV_ASSIGN_OR_RETURN(out.hi, Int(d, "hi", what));
    if (out.hi <= out.lo) return Status::Corruption(fmt::format("{}: empty range [{}, {})", what, out.lo, out.hi));
  }
  if (out.kind == ValueDomain::Kind::kConstant) {
    auto v = d.find("value");
    std::optional<double> value = v == d.end() ? std::nullopt : DoubleFromJson(*v);
    if (!value) return Status::Corruption(what + ".value: expected a number, \"inf\", \"-inf\" or \"nan\"");
    out.value = *value;
  }
  return out;
}

// SPEC, plus the DOMAIN beside it in `holder` (absent: real).
Result<TensorSpec> SpecFromJson(const json& holder, const std::string& what) {
  auto it = holder.find("tensor");
  if (it == holder.end() || !it->is_object()) return Status::Corruption(what + ": missing 'tensor'");
  const json& t = *it;
  TensorSpec spec;
  COV_ASSIGN_OR_RETURN(std::string dtype, Str(t, "dtype", what + ".tensor"));
  auto d = DTypeFromName(dtype);
  if (!d) return Status::Corruption(fmt::format("{}.tensor.dtype: unknown dtype '{}'", what, dtype));
  spec.dtype = *d;
  COV_ASSIGN_OR_RETURN(spec.shape, Ints(t.value("shape", json()), what + ".tensor.shape"));
  COV_ASSIGN_OR_RETURN(spec.strides, Ints(t.value("strides", json()), what + ".tensor.strides"));
  if (spec.shape.size() != spec.strides.size()) {
    return Status::Corruption(what + ".tensor: shape and strides differ in length");
  }
  for (int64_t s : spec.shape) {
    if (s < 0) return Status::Corruption(what + ".tensor.shape: negative size");
  }
  COV_ASSIGN_OR_RETURN(spec.storage_offset, Int(t, "storage_offset", what + ".tensor"));
  if (spec.storage_offset < 0) return Status::Corruption(what + ".tensor.storage_offset: negative");
  if (!spec.SizesFit()) {
    return Status::Corruption(what + ".tensor: its element count or storage extent overflows 64 bits");
  }
  auto dom = holder.find("domain");
  if (dom != holder.end() && !dom->is_null()) {
    COV_ASSIGN_OR_RETURN(spec.domain, DomainFromJson(*dom, what + ".domain"));
  } else if (spec.dtype == DType::kBool) {
    spec.domain.kind = ValueDomain::Kind::kBool;  // as the C++ observer describes every bool tensor
  }
  return spec;
}

Result<std::optional<double>> DoubleField(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Corruption(fmt::format("{}: missing '{}'", what, key));
  auto v = DoubleFromJson(*it);
  if (!v) return Status::Corruption(fmt::format("{}.{}: expected a number, \"inf\", \"-inf\" or \"nan\"", what, key));
  return v;
}

// One ARG of a call: fills `arg` and appends tensor value ids to `inputs`.
Status ArgFromJson(const json& j, const std::string& what, Argument* arg, std::vector<int64_t>* inputs) {
  if (!j.is_object()) return Status::Corruption(what + ": expected an object");
  COV_ASSIGN_OR_RETURN(arg->name, Str(j, "name", what));
  COV_ASSIGN_OR_RETURN(std::string kind, Str(j, "kind", what));
  const std::string here = what + " (" + arg->name + ")";
  if (kind == "none") {
    arg->kind = Argument::Kind::kNone;
  } else if (kind == "device") {
    arg->kind = Argument::Kind::kDevice;
  } else if (kind == "tensor") {
    arg->kind = Argument::Kind::kTensor;
    COV_ASSIGN_OR_RETURN(int64_t id, Int(j, "value", here));
    COV_ASSIGN_OR_RETURN(arg->tensor, SpecFromJson(j, here));
    inputs->push_back(id);
  } else if (kind == "tensor_list") {
    arg->kind = Argument::Kind::kTensorList;
    auto items = j.find("items");
    if (items == j.end() || !items->is_array()) return Status::Corruption(here + ": missing 'items'");
    for (size_t i = 0; i < items->size(); ++i) {
      const json& item = (*items)[i];
      if (item.is_null()) {
        arg->tensors.emplace_back(std::nullopt);
        inputs->push_back(-1);
        continue;
      }
      const std::string at = fmt::format("{}.items[{}]", here, i);
      COV_ASSIGN_OR_RETURN(int64_t id, Int(item, "value", at));
      COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(item, at));
      arg->tensors.emplace_back(std::move(spec));
      inputs->push_back(id);
    }
  } else if (kind == "int") {
    arg->kind = Argument::Kind::kInt;
    COV_ASSIGN_OR_RETURN(arg->i, Int(j, "i", here));
  } else if (kind == "double") {
    arg->kind = Argument::Kind::kDouble;
    COV_ASSIGN_OR_RETURN(auto d, DoubleField(j, "d", here));
    arg->d = *d;
  } else if (kind == "bool") {
    arg->kind = Argument::Kind::kBool;
    auto it = j.find("b");
    if (it == j.end() || !it->is_boolean()) return Status::Corruption(here + ".b: expected a boolean");
    arg->b = it->get<bool>();
  } else if (kind == "string") {
    arg->kind = Argument::Kind::kString;
    COV_ASSIGN_OR_RETURN(arg->s, Str(j, "s", here));
  } else if (kind == "int_list") {
    arg->kind = Argument::Kind::kIntList;
    COV_ASSIGN_OR_RETURN(arg->ints, Ints(j.value("ints", json()), here + ".ints"));
  } else if (kind == "double_list") {
    arg->kind = Argument::Kind::kDoubleList;
    const json v = j.value("doubles", json());
    if (!v.is_array()) return Status::Corruption(here + ".doubles: expected an array");
    for (const auto& e : v) {
      auto d = DoubleFromJson(e);
      if (!d) return Status::Corruption(here + ".doubles: expected numbers");
      arg->doubles.push_back(*d);
    }
  } else if (kind == "bool_list") {
    arg->kind = Argument::Kind::kBoolList;
    const json v = j.value("bools", json());
    if (!v.is_array()) return Status::Corruption(here + ".bools: expected an array");
    for (const auto& e : v) {
      if (!e.is_boolean()) return Status::Corruption(here + ".bools: expected booleans");
      arg->bools.push_back(e.get<bool>());
    }
  } else {
    return Status::Corruption(fmt::format("{}.kind: unknown argument kind '{}'", here, kind));
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
    std::string head(line.substr(0, 120));
    return Status::Corruption(fmt::format("{}: not a JSON record: {}", what, head));
  }
  COV_ASSIGN_OR_RETURN(std::string type, Str(j, "type", what));
  if (ended_ || error_) return Status::Corruption(fmt::format("{}: a '{}' record after the last record", what, type));
  if (type == "error") {
    TraceError e;
    COV_ASSIGN_OR_RETURN(e.stage, Str(j, "stage", what));
    COV_ASSIGN_OR_RETURN(e.reason, Str(j, "reason", what));
    COV_ASSIGN_OR_RETURN(e.exception, Str(j, "exception", what, /*required=*/false));
    error_ = std::move(e);
    return Status::Ok();
  }
  if (type == "start") {
    if (started_) return Status::Corruption(what + ": a second 'start' record");
    ProgramInfo& info = program_.info;
    COV_ASSIGN_OR_RETURN(int64_t version, Int(j, "tracer_version", what));
    if (version < kOldestTracerVersionRead || version > kTracerVersion) {
      return Status::Unsupported(fmt::format("{}: tracer_version {} but this build reads versions {} to {}", what,
                                             version, kOldestTracerVersionRead, kTracerVersion));
    }
    info.tracer_version = static_cast<int>(version);
    COV_ASSIGN_OR_RETURN(info.model_id, Str(j, "model", what));
    COV_ASSIGN_OR_RETURN(info.profile, Str(j, "profile", what));
    COV_ASSIGN_OR_RETURN(info.class_name, Str(j, "class", what));
    COV_ASSIGN_OR_RETURN(info.model_type, Str(j, "model_type", what, false));
    COV_ASSIGN_OR_RETURN(info.kind, Str(j, "kind", what));
    COV_ASSIGN_OR_RETURN(info.device, Str(j, "device", what));
    COV_ASSIGN_OR_RETURN(info.attn_implementation, Str(j, "attn_implementation", what, false));
    COV_ASSIGN_OR_RETURN(info.dtype, Str(j, "dtype", what, false));
    COV_ASSIGN_OR_RETURN(info.torch_version, Str(j, "torch", what, false));
    COV_ASSIGN_OR_RETURN(info.transformers_version, Str(j, "transformers", what, false));
    info.layers_json = DumpOrEmpty(j, "layers");
    if (info.layers_json.empty()) info.layers_json = "{}";
    info.fallback = DumpOrEmpty(j, "fallback");
    info.estimated_gb = Num(j, "estimated_gb");
    started_ = true;
    return Status::Ok();
  }
  if (!started_) return Status::Corruption(fmt::format("{}: a '{}' record before 'start'", what, type));
  if (type == "value") {
    ProgramValue v;
    COV_ASSIGN_OR_RETURN(v.id, Int(j, "id", what));
    COV_ASSIGN_OR_RETURN(v.kind, Str(j, "kind", what));
    COV_ASSIGN_OR_RETURN(v.name, Str(j, "name", what, false));
    COV_ASSIGN_OR_RETURN(v.unsupported, Str(j, "unsupported", what, false));
    if (v.unsupported.empty()) {
      COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(j, what));
      v.tensor = std::move(spec);
    }
    if (auto init = j.find("init"); init != j.end()) v.init = *init;
    if (auto scalar = j.find("scalar"); scalar != j.end()) v.scalar = *scalar;
    program_.values.push_back(std::move(v));
    return Status::Ok();
  }
  if (type == "call") {
    ProgramCall c;
    COV_ASSIGN_OR_RETURN(c.index, Int(j, "index", what));
    if (c.index != static_cast<int64_t>(program_.calls.size())) {
      return Status::Corruption(
          fmt::format("{}: call index {} where {} was expected", what, c.index, program_.calls.size()));
    }
    COV_ASSIGN_OR_RETURN(c.op, Str(j, "op", what));
    COV_ASSIGN_OR_RETURN(c.overload, Str(j, "overload", what, false));
    COV_ASSIGN_OR_RETURN(c.module, Str(j, "module", what, false));
    COV_ASSIGN_OR_RETURN(c.phase, Str(j, "phase", what));
    COV_ASSIGN_OR_RETURN(c.unsupported, Str(j, "unsupported", what, false));
    const std::string here = fmt::format("{} ({})", what, c.op);
    if (auto d = j.find("decomposition"); d != j.end()) {
      if (!d->is_array()) return Status::Corruption(here + ": 'decomposition' must be an array of op names");
      for (const json& n : *d) {
        if (!n.is_string()) return Status::Corruption(here + ": 'decomposition' must be an array of op names");
        c.decomposition.push_back(n.get<std::string>());
      }
    }
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
      COV_ASSIGN_OR_RETURN(int64_t id, Int(o, "value", at));
      c.outputs.push_back(id);
      if (o.contains("tensor")) {
        COV_ASSIGN_OR_RETURN(TensorSpec spec, SpecFromJson(o, at));
        c.output_specs.push_back(std::move(spec));
      }
    }
    program_.calls.push_back(std::move(c));
    return Status::Ok();
  }
  if (type == "end") {
    COV_ASSIGN_OR_RETURN(int64_t calls, Int(j, "calls", what));
    if (calls != static_cast<int64_t>(program_.calls.size())) {
      return Status::Corruption(
          fmt::format("{}: the end record counts {} calls but {} were read", what, calls, program_.calls.size()));
    }
    COV_ASSIGN_OR_RETURN(program_.info.value_count, Int(j, "values", what));
    program_.info.seconds = Num(j, "seconds");
    program_.info.peak_rss_mb = Num(j, "peak_rss_mb");
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

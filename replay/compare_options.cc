#include "replay/compare_options.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/input_rules.h"
#include "core/json_capped.h"

namespace coverage::replay {
namespace {

using nlohmann::json;

const OpToleranceOverride* FindOverride(const ComparisonOptions& o, std::string_view op, std::string_view overload) {
  if (!overload.empty()) {
    auto it = o.per_op.find(std::string(op) + "." + std::string(overload));
    if (it != o.per_op.end()) return &it->second;
  }
  auto it = o.per_op.find(std::string(op));
  return it == o.per_op.end() ? nullptr : &it->second;
}

Status ParseDTypeTable(const json& j, const std::string& where, std::map<DType, Tolerance>* tol,
                       std::map<DType, double>* mult) {
  if (!j.is_object()) return Status::InvalidArgument(where + ": expected an object keyed by dtype");
  for (const auto& [name, v] : j.items()) {
    auto dtype = DTypeFromName(name);
    if (!dtype) return Status::InvalidArgument(where + ": unknown dtype '" + name + "' (use f32, bf16, f16, f64, ...)");
    const std::string here = where + "." + name;
    if (!v.is_object()) return Status::InvalidArgument(here + ": expected {\"rtol\": .., \"atol\": .., \"multiplier\": ..}");
    for (const auto& [field, value] : v.items()) {
      if (field != "rtol" && field != "atol" && field != "multiplier") {
        return Status::InvalidArgument(here + ": unknown field '" + field + "'");
      }
      if (!value.is_number() || value.get<double>() < 0) {
        return Status::InvalidArgument(here + "." + field + ": expected a non-negative number");
      }
      // A relative tolerance of 100% or more passes any value of the right sign.
      if (field == "rtol" && value.get<double>() >= 1) {
        return Status::InvalidArgument(here + ".rtol: " + value.dump() + " passes any value; give a relative "
                                       "tolerance under 1 (f32's is 1.3e-6)");
      }
      if (field == "multiplier" && value.get<double>() < 1) {
        return Status::InvalidArgument(here + ".multiplier: " + value.dump() + " would demand the backend beat the "
                                       "CPU's own error against the fp64 golden; give 1 or more");
      }
    }
    if (v.contains("rtol") || v.contains("atol")) {
      Tolerance t = (*tol)[*dtype];
      t.rtol = v.value("rtol", t.rtol);
      t.atol = v.value("atol", t.atol);
      // Zero and zero passes only bit-identical values: no rounding a
      // reordered sum makes survives it, so every real backend would fail.
      if (t.rtol == 0 && t.atol == 0 && IsFloatingDType(*dtype)) {
        return Status::InvalidArgument(here + ": rtol and atol both 0 pass only bit-identical values; a backend "
                                       "whose kernels sum in another order would fail everything");
      }
      (*tol)[*dtype] = t;
    }
    if (v.contains("multiplier")) (*mult)[*dtype] = v["multiplier"].get<double>();
  }
  return Status::Ok();
}

// "values_not_compared": "all" | {"outputs": [1]} | {"when": "train"}.
Status ParseValuesNotCompared(const json& j, const std::string& where, ValuesNotCompared* out) {
  if (j.is_string() && j.get<std::string>() == "all") {
    out->all = true;
    return Status::Ok();
  }
  if (!j.is_object() || j.empty()) {
    return Status::InvalidArgument(where + R"(: expected "all", {"outputs": [index, ...]} or {"when": "<bool argument>"})");
  }
  for (const auto& [field, v] : j.items()) {
    if (field == "outputs") {
      if (!v.is_array() || v.empty()) return Status::InvalidArgument(where + ".outputs: expected a list of output indices");
      for (const auto& i : v) {
        if (!i.is_number_unsigned()) return Status::InvalidArgument(where + ".outputs: expected non-negative integers");
        out->outputs.push_back(i.get<size_t>());
      }
    } else if (field == "when") {
      if (!v.is_string() || v.get<std::string>().empty()) {
        return Status::InvalidArgument(where + ".when: expected the name of a bool argument");
      }
      out->when = v.get<std::string>();
    } else {
      return Status::InvalidArgument(where + ": unknown field '" + field + "' (expected outputs, when)");
    }
  }
  out->all = out->outputs.empty();
  return Status::Ok();
}

}  // namespace

bool ComparisonOptions::ValuesCompared(const OpCase& op_case, size_t output) const {
  const OpToleranceOverride* o = FindOverride(*this, op_case.op, op_case.overload);
  if (o == nullptr || !o->values_not_compared) return true;
  const ValuesNotCompared& rule = *o->values_not_compared;
  if (!rule.when.empty()) {
    bool set = false;
    for (const auto& a : op_case.args) {
      if (a.name == rule.when && a.kind == Argument::Kind::kBool) set = a.b;
    }
    if (!set) return true;
  }
  if (rule.all) return false;
  return std::find(rule.outputs.begin(), rule.outputs.end(), output) == rule.outputs.end();
}

Tolerance ComparisonOptions::For(std::string_view op, std::string_view overload, DType dtype) const {
  if (const auto* o = FindOverride(*this, op, overload)) {
    auto it = o->tolerances.find(dtype);
    if (it != o->tolerances.end()) return it->second;
  }
  auto it = tolerances.find(dtype);
  return it == tolerances.end() ? Tolerance{0, 0} : it->second;
}

double ComparisonOptions::MultiplierFor(std::string_view op, std::string_view overload, DType dtype) const {
  if (const auto* o = FindOverride(*this, op, overload)) {
    auto it = o->multipliers.find(dtype);
    if (it != o->multipliers.end()) return it->second;
  }
  auto it = multipliers.find(dtype);
  return it == multipliers.end() ? default_multiplier : it->second;
}

Result<ComparisonOptions> ComparisonOptions::FromJson(std::string_view text, std::string_view source_name) {
  const std::string src(source_name);
  COV_ASSIGN_OR_RETURN(json j, ParseJsonText(text, src));
  if (!j.is_object()) return Status::InvalidArgument(src + ": expected a JSON object");
  ComparisonOptions o;
  for (const auto& [key, value] : j.items()) {
    if (key == "comment" || key == "source") continue;
    if (key == "default_multiplier") {
      if (!value.is_number() || value.get<double>() < 1) {
        return Status::InvalidArgument(src + ": default_multiplier must be a number >= 1");
      }
      o.default_multiplier = value.get<double>();
    } else if (key == "dtypes") {
      COV_RETURN_IF_ERROR(ParseDTypeTable(value, src + ": dtypes", &o.tolerances, &o.multipliers));
    } else if (key == "ops") {
      if (!value.is_object()) return Status::InvalidArgument(src + ": ops: expected an object keyed by op name");
      for (const auto& [op, table] : value.items()) {
        const size_t colons = op.find("::");
        if (colons == std::string::npos) {
          return Status::InvalidArgument(src + ": ops: '" + op + "' must be a qualified name such as aten::" + op);
        }
        // namespace::name or namespace::name.overload, no part empty: a key
        // such as "aten::softmax." would never match a call.
        const std::string name = op.substr(colons + 2);
        const size_t dot = name.find('.');
        if (colons == 0 || name.empty() || name.find("::") != std::string::npos || dot == 0 ||
            (dot != std::string::npos && (dot + 1 == name.size() || name.find('.', dot + 1) != std::string::npos))) {
          return Status::InvalidArgument(src + ": ops: '" + op +
                                         "' is not an op name: write namespace::name or namespace::name.overload, "
                                         "e.g. aten::softmax or aten::add.Tensor");
        }
        OpToleranceOverride ov;
        ov.tolerances = o.tolerances;  // partial overrides start from the defaults
        ov.multipliers = o.multipliers;
        // Either a table keyed by dtype, or {"dtypes": ..., "values_not_compared": ..., "inputs": ...,
        // "reason": ...}. The inputs are built in (core/input_rules.h): a file may repeat them, not change them.
        json dtypes = table;
        bool judged = true;  // the entry says how outputs are judged (not only how inputs are made)
        if (table.is_object() && (table.contains("dtypes") || table.contains("values_not_compared") ||
                                  table.contains("reason") || table.contains("inputs"))) {
          dtypes = json::object();
          judged = table.contains("dtypes") || table.contains("values_not_compared");
          for (const auto& [field, v] : table.items()) {
            if (field == "comment") continue;
            if (field == "reason" && v.is_string()) continue;
            if (field == "inputs") {
              if (v != BuiltInInputRules(op)) {
                return Status::InvalidArgument(
                    src + ": ops." + op +
                    ".inputs: differs from the input rules built into coverage (configs/tolerances.json at build "
                    "time; a case's inputs must be the same in every run): leave it out, or edit the shipped file "
                    "and rebuild");
              }
              continue;
            }
            if (field == "dtypes") {
              dtypes = v;
            } else if (field == "values_not_compared") {
              ValuesNotCompared rule;
              COV_RETURN_IF_ERROR(ParseValuesNotCompared(v, src + ": ops." + op + ".values_not_compared", &rule));
              ov.values_not_compared = std::move(rule);
            } else {
              return Status::InvalidArgument(src + ": ops." + op + ": unknown field '" + field +
                                             "' (expected dtypes, values_not_compared, inputs, reason, comment)");
            }
          }
        }
        COV_RETURN_IF_ERROR(ParseDTypeTable(dtypes, src + ": ops." + op, &ov.tolerances, &ov.multipliers));
        if (judged) o.per_op[op] = std::move(ov);
      }
    } else {
      return Status::InvalidArgument(src + ": unknown key '" + key + "' (expected dtypes, ops, default_multiplier)");
    }
  }
  return o;
}

}  // namespace coverage::replay

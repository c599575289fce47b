#include "core/op_case.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/json_double.h"
#include "core/sha256.h"

namespace coverage {
namespace {

using nlohmann::json;

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int64_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "f32", 4},  {DType::kFloat64, "f64", 8},  {DType::kFloat16, "f16", 2},
    {DType::kBFloat16, "bf16", 2}, {DType::kInt8, "i8", 1},     {DType::kUInt8, "u8", 1},
    {DType::kInt16, "i16", 2},    {DType::kInt32, "i32", 4},    {DType::kInt64, "i64", 8},
    {DType::kBool, "b8", 1},      {DType::kComplex64, "c64", 8}, {DType::kComplex128, "c128", 16},
};

constexpr std::pair<ValueDomain::Kind, std::string_view> kDomainNames[] = {
    {ValueDomain::Kind::kReal, "real"},         {ValueDomain::Kind::kNonNegative, "nonneg"},
    {ValueDomain::Kind::kPositive, "positive"}, {ValueDomain::Kind::kUnit, "unit"},
    {ValueDomain::Kind::kMask, "mask"},         {ValueDomain::Kind::kInteger, "int"},
    {ValueDomain::Kind::kBool, "bool"},         {ValueDomain::Kind::kConstant, "const"},
};

constexpr std::pair<Argument::Kind, std::string_view> kArgKindNames[] = {
    {Argument::Kind::kNone, "none"},          {Argument::Kind::kTensor, "tensor"},
    {Argument::Kind::kTensorList, "tensor[]"}, {Argument::Kind::kInt, "int"},
    {Argument::Kind::kDouble, "float"},       {Argument::Kind::kBool, "bool"},
    {Argument::Kind::kString, "str"},         {Argument::Kind::kIntList, "int[]"},
    {Argument::Kind::kDoubleList, "float[]"}, {Argument::Kind::kBoolList, "bool[]"},
    {Argument::Kind::kDevice, "device"},
};

Result<double> RequireDouble(const json& j, std::string_view what) {
  if (auto v = coverage::DoubleFromJson(j)) return *v;
  return Status::Corruption(std::string(what) + ": expected a number, \"inf\", \"-inf\" or \"nan\"");
}

json TensorToJson(const TensorSpec& t) {
  json j;
  j["dtype"] = DTypeName(t.dtype);
  j["shape"] = t.shape;
  j["strides"] = t.strides;
  j["offset"] = t.storage_offset;
  json d;
  d["kind"] = ValueDomainKindName(t.domain.kind);
  if (t.domain.kind == ValueDomain::Kind::kInteger) {
    d["lo"] = t.domain.lo;
    d["hi"] = t.domain.hi;
  }
  if (t.domain.kind == ValueDomain::Kind::kConstant) d["value"] = DoubleToJson(t.domain.value);
  j["domain"] = std::move(d);
  return j;
}

// Optional fields with a type check: a wrong type is a Corruption naming the
// field, never an exception.
Result<int64_t> IntField(const json& j, const char* key, int64_t fallback, const std::string& what) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  if (!j[key].is_number_integer()) return Status::Corruption(what + "." + key + ": expected an integer");
  return j[key].get<int64_t>();
}

Result<std::string> StringField(const json& j, const char* key, const std::string& fallback, const std::string& what) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  if (!j[key].is_string()) return Status::Corruption(what + "." + key + ": expected a string");
  return j[key].get<std::string>();
}

Result<std::vector<int64_t>> IntsFromJson(const json& j, std::string_view what) {
  if (!j.is_array()) return Status::Corruption(std::string(what) + ": expected an array of integers");
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (const auto& v : j) {
    if (!v.is_number_integer()) return Status::Corruption(std::string(what) + ": expected integers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

Result<TensorSpec> TensorFromJson(const json& j, const std::string& what) {
  if (!j.is_object()) return Status::Corruption(what + ": expected a tensor object");
  TensorSpec t;
  if (!j.contains("dtype") || !j["dtype"].is_string()) return Status::Corruption(what + ".dtype: missing");
  auto dtype = DTypeFromName(j["dtype"].get<std::string>());
  if (!dtype) return Status::Corruption(what + ".dtype: unknown dtype '" + j["dtype"].get<std::string>() + "'");
  t.dtype = *dtype;
  COV_ASSIGN_OR_RETURN(t.shape, IntsFromJson(j.value("shape", json()), what + ".shape"));
  COV_ASSIGN_OR_RETURN(t.strides, IntsFromJson(j.value("strides", json()), what + ".strides"));
  if (t.strides.size() != t.shape.size()) {
    return Status::Corruption(what + ": strides has " + std::to_string(t.strides.size()) +
                              " entries but shape has " + std::to_string(t.shape.size()));
  }
  for (int64_t s : t.shape) {
    if (s < 0) return Status::Corruption(what + ".shape: negative size " + std::to_string(s));
  }
  COV_ASSIGN_OR_RETURN(t.storage_offset, IntField(j, "offset", 0, what));
  if (t.storage_offset < 0) return Status::Corruption(what + ".offset: negative");
  if (!t.SizesFit()) return Status::Corruption(what + ": its element count or storage extent overflows 64 bits");
  if (j.contains("domain")) {
    const json& d = j["domain"];
    if (!d.is_object()) return Status::Corruption(what + ".domain: expected an object");
    COV_ASSIGN_OR_RETURN(std::string kind, StringField(d, "kind", "real", what + ".domain"));
    bool found = false;
    for (auto [k, name] : kDomainNames) {
      if (name == kind) { t.domain.kind = k; found = true; }
    }
    if (!found) return Status::Corruption(what + ".domain.kind: unknown '" + kind + "'");
    if (t.domain.kind == ValueDomain::Kind::kInteger) {
      COV_ASSIGN_OR_RETURN(t.domain.lo, IntField(d, "lo", 0, what + ".domain"));
      COV_ASSIGN_OR_RETURN(t.domain.hi, IntField(d, "hi", 0, what + ".domain"));
      if (t.domain.hi <= t.domain.lo) {
        return Status::Corruption(what + ".domain: empty integer range [" + std::to_string(t.domain.lo) +
                                  ", " + std::to_string(t.domain.hi) + ")");
      }
    }
    if (t.domain.kind == ValueDomain::Kind::kConstant) {
      if (!d.contains("value")) return Status::Corruption(what + ".domain: a constant without 'value'");
      COV_ASSIGN_OR_RETURN(t.domain.value, RequireDouble(d["value"], what + ".domain.value"));
    }
  }
  return t;
}

json ArgToJson(const Argument& a) {
  json j;
  j["name"] = a.name;
  j["type"] = ArgumentKindName(a.kind);
  switch (a.kind) {
    case Argument::Kind::kNone:
    case Argument::Kind::kDevice:
      break;
    case Argument::Kind::kTensor:
      j["tensor"] = TensorToJson(a.tensor);
      break;
    case Argument::Kind::kTensorList: {
      json items = json::array();
      for (const auto& t : a.tensors) items.push_back(t ? TensorToJson(*t) : json(nullptr));
      j["items"] = std::move(items);
      break;
    }
    case Argument::Kind::kInt: j["value"] = a.i; break;
    case Argument::Kind::kDouble: j["value"] = DoubleToJson(a.d); break;
    case Argument::Kind::kBool: j["value"] = a.b; break;
    case Argument::Kind::kString: j["value"] = a.s; break;
    case Argument::Kind::kIntList: j["value"] = a.ints; break;
    case Argument::Kind::kDoubleList: {
      json v = json::array();
      for (double d : a.doubles) v.push_back(DoubleToJson(d));
      j["value"] = std::move(v);
      break;
    }
    case Argument::Kind::kBoolList: {
      json v = json::array();
      for (bool b : a.bools) v.push_back(b);
      j["value"] = std::move(v);
      break;
    }
  }
  return j;
}

Result<Argument> ArgFromJson(const json& j, const std::string& what) {
  if (!j.is_object()) return Status::Corruption(what + ": expected an object");
  Argument a;
  COV_ASSIGN_OR_RETURN(a.name, StringField(j, "name", "", what));
  COV_ASSIGN_OR_RETURN(std::string type, StringField(j, "type", "", what));
  bool found = false;
  for (auto [k, name] : kArgKindNames) {
    if (name == type) { a.kind = k; found = true; }
  }
  if (!found) return Status::Corruption(what + ".type: unknown argument type '" + type + "'");
  const std::string here = what + " (" + a.name + ")";
  auto need_value = [&]() -> Result<json> {
    if (!j.contains("value")) return Status::Corruption(here + ": missing 'value'");
    return j["value"];
  };
  switch (a.kind) {
    case Argument::Kind::kNone:
    case Argument::Kind::kDevice:
      break;
    case Argument::Kind::kTensor: {
      if (!j.contains("tensor")) return Status::Corruption(here + ": missing 'tensor'");
      COV_ASSIGN_OR_RETURN(a.tensor, TensorFromJson(j["tensor"], here + ".tensor"));
      break;
    }
    case Argument::Kind::kTensorList: {
      const json items = j.value("items", json());
      if (!items.is_array()) return Status::Corruption(here + ".items: expected an array");
      for (size_t i = 0; i < items.size(); ++i) {
        if (items[i].is_null()) {
          a.tensors.emplace_back(std::nullopt);
        } else {
          COV_ASSIGN_OR_RETURN(auto t, TensorFromJson(items[i], here + ".items[" + std::to_string(i) + "]"));
          a.tensors.emplace_back(std::move(t));
        }
      }
      break;
    }
    case Argument::Kind::kInt: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      if (!v.is_number_integer()) return Status::Corruption(here + ".value: expected an integer");
      a.i = v.get<int64_t>();
      break;
    }
    case Argument::Kind::kDouble: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      COV_ASSIGN_OR_RETURN(a.d, RequireDouble(v, here + ".value"));
      break;
    }
    case Argument::Kind::kBool: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      if (!v.is_boolean()) return Status::Corruption(here + ".value: expected a boolean");
      a.b = v.get<bool>();
      break;
    }
    case Argument::Kind::kString: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      if (!v.is_string()) return Status::Corruption(here + ".value: expected a string");
      a.s = v.get<std::string>();
      break;
    }
    case Argument::Kind::kIntList: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      COV_ASSIGN_OR_RETURN(a.ints, IntsFromJson(v, here + ".value"));
      break;
    }
    case Argument::Kind::kDoubleList: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      if (!v.is_array()) return Status::Corruption(here + ".value: expected an array");
      for (const auto& e : v) {
        COV_ASSIGN_OR_RETURN(double d, RequireDouble(e, here + ".value"));
        a.doubles.push_back(d);
      }
      break;
    }
    case Argument::Kind::kBoolList: {
      COV_ASSIGN_OR_RETURN(json v, need_value());
      if (!v.is_array()) return Status::Corruption(here + ".value: expected an array");
      for (const auto& e : v) {
        if (!e.is_boolean()) return Status::Corruption(here + ".value: expected booleans");
        a.bools.push_back(e.get<bool>());
      }
      break;
    }
  }
  return a;
}

std::string FormatDouble(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  json j = d;
  return j.dump();
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  return "?";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

bool IsFloatingDType(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

bool IsIntegralDType(DType dtype) {
  return dtype == DType::kInt8 || dtype == DType::kUInt8 || dtype == DType::kInt16 ||
         dtype == DType::kInt32 || dtype == DType::kInt64;
}

int64_t DTypeSize(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info.size;
  }
  return 0;
}

std::string_view ValueDomainKindName(ValueDomain::Kind kind) {
  for (auto [k, name] : kDomainNames) {
    if (k == kind) return name;
  }
  return "?";
}

std::string_view ArgumentKindName(Argument::Kind kind) {
  for (auto [k, name] : kArgKindNames) {
    if (k == kind) return name;
  }
  return "?";
}

int64_t TensorSpec::Numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorSpec::StorageNumel() const {
  if (Numel() == 0) return storage_offset;
  int64_t last = storage_offset;
  for (size_t i = 0; i < shape.size(); ++i) last += (shape[i] - 1) * std::max<int64_t>(strides[i], 0);
  return last + 1;
}

// Note [Storage keys]
// Replay makes a tensor argument's whole storage (StorageNumel elements) and
// views it with the recorded shape, strides and offset; the storage's values
// depend on this key, the argument's rank among the case's arguments of the
// same key, and the seed. Keying by storage rather than by view lets the
// cases of one model that read a weight through different views (`t` of it,
// `mm` with its transpose, an `embedding` of a tied table) share one made
// storage, and lets the unit stage run them one after the other
// (stages/unit_stage.cc) while that storage is still in the input cache.
std::string TensorSpec::StorageKey() const {
  std::string k = std::string(DTypeName(dtype)) + "[" + std::to_string(StorageNumel()) + "]" +
                  std::string(ValueDomainKindName(domain.kind));
  if (domain.kind == ValueDomain::Kind::kInteger) k += std::to_string(domain.lo) + ":" + std::to_string(domain.hi);
  if (domain.kind == ValueDomain::Kind::kMask) k += ToShortString();
  if (domain.kind == ValueDomain::Kind::kConstant) k += DoubleToJson(domain.value).dump();
  return k;
}

bool TensorSpec::SizesFit() const {
  int64_t n = 1, last = storage_offset;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) return false;
  }
  for (size_t i = 0; i < shape.size() && i < strides.size(); ++i) {
    int64_t step = 0;
    if (shape[i] == 0) continue;
    if (__builtin_mul_overflow(shape[i] - 1, std::max<int64_t>(strides[i], 0), &step) ||
        __builtin_add_overflow(last, step, &last)) {
      return false;
    }
  }
  return last < std::numeric_limits<int64_t>::max();
}

bool TensorSpec::IsContiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) return false;
    expected *= shape[i];
  }
  return storage_offset == 0;
}

std::string TensorSpec::ToShortString() const {
  std::string out(DTypeName(dtype));
  out += "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(shape[i]);
  }
  out += "]";
  if (!IsContiguous()) {
    out += "{s=";
    for (size_t i = 0; i < strides.size(); ++i) {
      if (i) out += ",";
      out += std::to_string(strides[i]);
    }
    if (storage_offset) out += ";o=" + std::to_string(storage_offset);
    out += "}";
  }
  if (domain.kind == ValueDomain::Kind::kConstant) out += "=" + DoubleToJson(domain.value).dump();
  return out;
}

std::string TensorSpec::ToJson() const { return TensorToJson(*this).dump(); }

Result<TensorSpec> TensorSpec::FromJson(std::string_view text, const std::string& what) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption(what + ": not valid JSON");
  return TensorFromJson(j, what);
}

std::string OpCase::QualifiedName() const {
  return overload.empty() ? op : op + "." + overload;
}

json OpCase::ToJsonValue() const {
  json j;
  j["v"] = kOpCaseVersion;
  j["op"] = op;
  j["overload"] = overload;
  json args = json::array();
  for (const auto& a : this->args) args.push_back(ArgToJson(a));
  j["args"] = std::move(args);
  return j;
}

std::string OpCase::ToCanonicalJson() const {
  return ToJsonValue().dump();  // nlohmann::json keeps object keys sorted
}

Result<OpCase> OpCase::FromJson(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption("op case JSON does not parse");
  return FromJsonValue(j);
}

Result<OpCase> OpCase::FromJsonValue(const json& j) {
  if (!j.is_object()) return Status::Corruption("op case JSON: expected an object");
  COV_ASSIGN_OR_RETURN(int64_t version, IntField(j, "v", 0, "op case JSON"));
  if (version != kOpCaseVersion) {
    return Status::Corruption("op case JSON: version " + std::to_string(version) + " is not supported (expected " +
                              std::to_string(kOpCaseVersion) + ")");
  }
  OpCase c;
  if (!j.contains("op") || !j["op"].is_string()) return Status::Corruption("op case JSON: missing 'op'");
  c.op = j["op"].get<std::string>();
  COV_ASSIGN_OR_RETURN(c.overload, StringField(j, "overload", "", "op case JSON"));
  const json args = j.value("args", json());
  if (!args.is_array()) return Status::Corruption("op case JSON: 'args' must be an array");
  for (size_t i = 0; i < args.size(); ++i) {
    COV_ASSIGN_OR_RETURN(auto a, ArgFromJson(args[i], c.op + " args[" + std::to_string(i) + "]"));
    c.args.push_back(std::move(a));
  }
  return c;
}

std::string OpCase::Key() const { return Sha256Hex(ToCanonicalJson()).substr(0, 16); }

std::string OpCase::Summary() const {
  std::string out = QualifiedName() + "(";
  bool first = true;
  for (const auto& a : args) {
    std::string v;
    switch (a.kind) {
      case Argument::Kind::kNone: continue;  // omitted: defaults are the common case
      case Argument::Kind::kDevice: continue;
      case Argument::Kind::kTensor: v = a.tensor.ToShortString(); break;
      case Argument::Kind::kTensorList: {
        v = "[";
        for (size_t i = 0; i < a.tensors.size(); ++i) {
          if (i) v += ", ";
          v += a.tensors[i] ? a.tensors[i]->ToShortString() : "None";
        }
        v += "]";
        break;
      }
      case Argument::Kind::kInt: v = a.name + "=" + std::to_string(a.i); break;
      case Argument::Kind::kDouble: v = a.name + "=" + FormatDouble(a.d); break;
      case Argument::Kind::kBool: v = a.name + "=" + (a.b ? "True" : "False"); break;
      case Argument::Kind::kString: v = a.name + "='" + a.s + "'"; break;
      case Argument::Kind::kIntList: {
        v = a.name + "=[";
        for (size_t i = 0; i < a.ints.size(); ++i) v += (i ? "," : "") + std::to_string(a.ints[i]);
        v += "]";
        break;
      }
      case Argument::Kind::kDoubleList: {
        v = a.name + "=[";
        for (size_t i = 0; i < a.doubles.size(); ++i) v += (i ? "," : "") + FormatDouble(a.doubles[i]);
        v += "]";
        break;
      }
      case Argument::Kind::kBoolList: {
        v = a.name + "=[";
        for (size_t i = 0; i < a.bools.size(); ++i) v += std::string(i ? "," : "") + (a.bools[i] ? "True" : "False");
        v += "]";
        break;
      }
    }
    if (!first) out += ", ";
    out += v;
    first = false;
  }
  out += ")";
  return out;
}

void OpCase::ForEachTensor(const std::function<void(const TensorSpec&)>& f) const {
  for (const auto& a : args) {
    if (a.kind == Argument::Kind::kTensor) f(a.tensor);
    if (a.kind == Argument::Kind::kTensorList) {
      for (const auto& t : a.tensors) {
        if (t) f(*t);
      }
    }
  }
}

std::vector<DType> OpCase::DTypes() const {
  std::set<std::string_view> names;
  ForEachTensor([&](const TensorSpec& t) { names.insert(DTypeName(t.dtype)); });
  std::vector<DType> out;
  for (auto n : names) out.push_back(*DTypeFromName(n));
  return out;
}

}  // namespace coverage

#include "core/op_case.h"

#include "core/json_fields.h"

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

Result<TensorSpec> TensorFromJson(const json& j, const std::string& what) {
  const JsonFields f(j, what);
  COV_ASSIGN_OR_RETURN(TensorSpec t, TensorLayoutFromJson(f, "offset", /*offset_required=*/false));
  if (const json* domain = f.Find("domain")) {
    const JsonFields d = f.Sub("domain", *domain);
    std::string kind = "real";
    COV_RETURN_IF_ERROR(d.String("kind", &kind));
    bool found = false;
    for (auto [k, name] : kDomainNames) {
      if (name == kind) { t.domain.kind = k; found = true; }
    }
    if (!found) return d.Error("kind", "unknown '" + kind + "'");
    if (t.domain.kind == ValueDomain::Kind::kInteger) {
      COV_RETURN_IF_ERROR(d.Int("lo", &t.domain.lo));
      COV_RETURN_IF_ERROR(d.Int("hi", &t.domain.hi));
      if (t.domain.hi <= t.domain.lo) {
        return Status::Corruption(d.what() + ": empty integer range [" + std::to_string(t.domain.lo) + ", " +
                                  std::to_string(t.domain.hi) + ")");
      }
    }
    if (t.domain.kind == ValueDomain::Kind::kConstant) {
      if (!d.Has("value")) return Status::Corruption(d.what() + ": a constant without 'value'");
      COV_RETURN_IF_ERROR(d.Double("value", &t.domain.value));
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
  Argument a;
  {
    const JsonFields f(j, what);
    COV_RETURN_IF_ERROR(f.String("name", &a.name));
    std::string type;
    COV_RETURN_IF_ERROR(f.String("type", &type));
    bool found = false;
    for (auto [k, name] : kArgKindNames) {
      if (name == type) { a.kind = k; found = true; }
    }
    if (!found) return f.Error("type", "unknown argument type '" + type + "'");
  }
  const JsonFields f(j, what + " (" + a.name + ")");
  switch (a.kind) {
    case Argument::Kind::kNone:
    case Argument::Kind::kDevice:
      break;
    case Argument::Kind::kTensor: {
      COV_RETURN_IF_ERROR(f.Require("tensor"));
      COV_ASSIGN_OR_RETURN(a.tensor, TensorFromJson(*f.Find("tensor"), f.what() + ".tensor"));
      break;
    }
    case Argument::Kind::kTensorList: {
      const json* items = f.Find("items");
      if (!items || !items->is_array()) return f.Error("items", "expected an array");
      for (size_t i = 0; i < items->size(); ++i) {
        if ((*items)[i].is_null()) {
          a.tensors.emplace_back(std::nullopt);
        } else {
          COV_ASSIGN_OR_RETURN(auto t, TensorFromJson((*items)[i], f.what() + ".items[" + std::to_string(i) + "]"));
          a.tensors.emplace_back(std::move(t));
        }
      }
      break;
    }
    case Argument::Kind::kInt:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Int("value", &a.i));
      break;
    case Argument::Kind::kDouble:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Double("value", &a.d));
      break;
    case Argument::Kind::kBool:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Bool("value", &a.b));
      break;
    case Argument::Kind::kString:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.String("value", &a.s));
      break;
    case Argument::Kind::kIntList:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Ints("value", &a.ints));
      break;
    case Argument::Kind::kDoubleList:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Doubles("value", &a.doubles));
      break;
    case Argument::Kind::kBoolList:
      COV_RETURN_IF_ERROR(f.Require("value"));
      COV_RETURN_IF_ERROR(f.Bools("value", &a.bools));
      break;
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
  const JsonFields f(j, "op case JSON");
  int64_t version = 0;
  COV_RETURN_IF_ERROR(f.Int("v", &version));
  if (version != kOpCaseVersion) {
    return Status::Corruption("op case JSON: version " + std::to_string(version) + " is not supported (expected " +
                              std::to_string(kOpCaseVersion) + ")");
  }
  OpCase c;
  COV_RETURN_IF_ERROR(f.RequiredString("op", &c.op));
  COV_RETURN_IF_ERROR(f.String("overload", &c.overload));
  const json* args = f.Find("args");
  if (!args || !args->is_array()) return f.Error("args", "expected an array");
  for (size_t i = 0; i < args->size(); ++i) {
    COV_ASSIGN_OR_RETURN(auto a, ArgFromJson((*args)[i], c.op + " args[" + std::to_string(i) + "]"));
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

Result<TensorSpec> TensorLayoutFromJson(const JsonFields& f, const char* offset_key, bool offset_required) {
  TensorSpec t;
  std::string dtype_name;
  COV_RETURN_IF_ERROR(f.RequiredString("dtype", &dtype_name));
  auto dtype = DTypeFromName(dtype_name);
  if (!dtype) return f.Error("dtype", "unknown dtype '" + dtype_name + "'");
  t.dtype = *dtype;
  COV_RETURN_IF_ERROR(f.Require("shape"));
  COV_RETURN_IF_ERROR(f.Require("strides"));
  COV_RETURN_IF_ERROR(f.Ints("shape", &t.shape));
  COV_RETURN_IF_ERROR(f.Ints("strides", &t.strides));
  if (t.strides.size() != t.shape.size()) {
    return Status::Corruption(f.what() + ": strides has " + std::to_string(t.strides.size()) +
                              " entries but shape has " + std::to_string(t.shape.size()));
  }
  for (int64_t s : t.shape) {
    if (s < 0) return f.Error("shape", "negative size " + std::to_string(s));
  }
  if (offset_required) COV_RETURN_IF_ERROR(f.Require(offset_key));
  COV_RETURN_IF_ERROR(f.Int(offset_key, &t.storage_offset, int64_t{0}));
  if (!t.SizesFit()) return Status::Corruption(f.what() + ": its element count or storage extent overflows 64 bits");
  return t;
}

}  // namespace coverage

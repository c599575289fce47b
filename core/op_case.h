// OpCase: one ATen operator call, described completely enough to be replayed
// on any backend without the model that made it.
//
// An OpCase is a record (Habit 9: describe a case once, run it everywhere):
// the op's schema name and overload plus every argument in schema order.
// Tensors are described, not stored: dtype, shape, strides, storage offset
// and a *value domain* (the range replayed values must stay in for the call
// to be valid, e.g. indices below the indexed dimension's size).
//
// The canonical JSON form (ToCanonicalJson) is versioned by kOpCaseVersion and
// has sorted keys and no whitespace, so the same call always serialises to
// the same bytes; Key() is a hash of those bytes and identifies the case in
// the registry. Changing the JSON form requires bumping kOpCaseVersion.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/result.h"

namespace coverage {

class JsonFields;  // core/json_fields.h

inline constexpr int kOpCaseVersion = 1;

enum class DType {
  kFloat32, kFloat64, kFloat16, kBFloat16,
  kInt8, kUInt8, kInt16, kInt32, kInt64, kBool,
  kComplex64, kComplex128,
};

// Short stable names used in JSON, tables and filters: f32 f64 f16 bf16 i8 u8
// i16 i32 i64 b8 c64 c128.
std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);
bool IsFloatingDType(DType dtype);  // f16, bf16, f32, f64
bool IsIntegralDType(DType dtype);  // integers, excluding bool
int64_t DTypeSize(DType dtype);     // bytes per element

// Where a replayed tensor's values must lie. Derived at capture time from the
// values the model really passed (domain_of in capture/tracer/coverage_tracer/encode.py), coarsened so that
// calls that differ only in their data merge into one case.
struct ValueDomain {
  enum class Kind {
    kReal,         // any finite value; replayed uniformly in [-1, 1)
    kNonNegative,  // >= 0 (e.g. the variance fed to rsqrt); replayed in [0, 2)
    kPositive,     // > 0 (e.g. a divisor); replayed in [0.5, 2)
    kUnit,         // in [0, 1] (probabilities, masks); replayed in [0.002, 0.998)
    kMask,         // additive attention mask: 0 or -inf, replayed causally
    kInteger,      // integers in [lo, hi); replayed uniformly in that range
    kBool,         // booleans; replayed as a fixed pseudo-random pattern
    kConstant,     // one recorded value: a Python number passed for a Tensor argument
                   // (AdamW's param.mul_(1 - lr * wd)), replayed as itself
  };
  Kind kind = Kind::kReal;
  int64_t lo = 0;      // kInteger only: inclusive lower bound
  int64_t hi = 0;      // kInteger only: exclusive upper bound
  double value = 0.0;  // kConstant only (exact for integers up to 2^53)

  bool operator==(const ValueDomain&) const = default;
};

std::string_view ValueDomainKindName(ValueDomain::Kind kind);

struct TensorSpec {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements, same length as shape
  int64_t storage_offset = 0;
  ValueDomain domain;

  int64_t Numel() const;
  // Elements the underlying storage must hold for these strides and offset.
  int64_t StorageNumel() const;
  bool IsContiguous() const;
  // False when Numel() or StorageNumel() would overflow int64: the JSON
  // parsers refuse such a spec (a corrupt or hostile record) rather than let
  // every size computation after them be undefined.
  bool SizesFit() const;
  // What fixes the values replay gives the storage under this view: dtype,
  // storage size and value domain (and the shape, for a mask, whose values
  // follow its rows and columns). A weight and a transposed or sliced view
  // of it have one storage key, so the cases that read them share values
  // and the replay's input cache. Note [Storage keys] in op_case.cc.
  std::string StorageKey() const;
  // "f32[8,1,2048]" with "{s=...}" appended when not contiguous, "=0.99999" for a constant.
  std::string ToShortString() const;
  // The form a tensor argument has in the canonical case JSON (compact).
  std::string ToJson() const;
  // Parses what ToJson wrote. Errors name `what` and the field.
  static Result<TensorSpec> FromJson(std::string_view json, const std::string& what = "tensor");

  bool operator==(const TensorSpec&) const = default;
};

// A tensor's layout read from the members of `f` (core/json_fields.h):
// "dtype", "shape", "strides" and the storage offset under `offset_key`
// (required when `offset_required`, else 0 when absent), checked: a known
// dtype, as many strides as sizes, no negative size or offset, an element
// count and storage extent that fit 64 bits. The op case's JSON and the
// tracer's records both read a tensor through it; the domain is their own.
Result<TensorSpec> TensorLayoutFromJson(const JsonFields& f, const char* offset_key, bool offset_required);

// One argument in schema order. `kind` says which member is meaningful.
struct Argument {
  enum class Kind {
    kNone,        // None for an optional argument
    kTensor,
    kTensorList,  // Tensor[] or Tensor?[] (items may be absent)
    kInt,         // int, SymInt, or an int-valued Scalar / dtype / layout / memory format
    kDouble,      // float, or a float-valued Scalar
    kBool,
    kString,
    kIntList,
    kDoubleList,
    kBoolList,
    kDevice,      // replayed as the device of the backend under test
  };

  std::string name;  // schema argument name, e.g. "self", "dim"
  Kind kind = Kind::kNone;
  TensorSpec tensor;                              // kTensor
  std::vector<std::optional<TensorSpec>> tensors;  // kTensorList
  int64_t i = 0;                                  // kInt
  double d = 0.0;                                 // kDouble (inf/nan allowed)
  bool b = false;                                 // kBool
  std::string s;                                  // kString
  std::vector<int64_t> ints;                      // kIntList
  std::vector<double> doubles;                    // kDoubleList
  std::vector<bool> bools;                        // kBoolList

  bool operator==(const Argument&) const = default;
};

std::string_view ArgumentKindName(Argument::Kind kind);

struct OpCase {
  std::string op;        // schema name, e.g. "aten::addmm"
  std::string overload;  // e.g. "out"; empty for the default overload
  std::vector<Argument> args;

  // "aten::add.Tensor" or "aten::add".
  std::string QualifiedName() const;

  // Canonical, versioned JSON (sorted keys, compact). Identical calls give
  // identical bytes.
  std::string ToCanonicalJson() const;
  // Parses what ToCanonicalJson wrote (any key order). Errors name the field.
  static Result<OpCase> FromJson(std::string_view json);
  // The same form as a JSON value, for messages that carry the case inside
  // a larger object (the worker protocol): one serializer, two containers.
  nlohmann::json ToJsonValue() const;
  static Result<OpCase> FromJsonValue(const nlohmann::json& j);

  // Stable identity: the first 16 hex digits of SHA-256(ToCanonicalJson()).
  std::string Key() const;

  // One line for people: "aten::addmm(f32[2048], f32[512,2048], f32[2048,5632]{s=1,2048}, beta=1, alpha=1)".
  std::string Summary() const;

  // Tensor dtypes used by the arguments (deduplicated, sorted by name).
  std::vector<DType> DTypes() const;

  // Calls `f` with every tensor argument's spec in argument order, the
  // items of tensor lists included and their None items left out.
  void ForEachTensor(const std::function<void(const TensorSpec&)>& f) const;

  bool operator==(const OpCase&) const = default;
};

}  // namespace coverage

// Helpers to write OpCases by hand in tests.
#pragma once

#include <string>
#include <vector>

#include "core/op_case.h"

namespace coverage::testing {

inline std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

inline TensorSpec Spec(DType dtype, std::vector<int64_t> shape, ValueDomain domain = {}) {
  TensorSpec t;
  t.dtype = dtype;
  t.strides = ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.domain = domain;
  return t;
}

inline Argument TensorArg(std::string name, TensorSpec spec) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kTensor;
  a.tensor = std::move(spec);
  return a;
}

inline Argument TensorArg(std::string name, DType dtype, std::vector<int64_t> shape) {
  return TensorArg(std::move(name), Spec(dtype, std::move(shape)));
}

inline Argument IntArg(std::string name, int64_t v) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kInt;
  a.i = v;
  return a;
}

inline Argument DoubleArg(std::string name, double v) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kDouble;
  a.d = v;
  return a;
}

inline Argument BoolArg(std::string name, bool v) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kBool;
  a.b = v;
  return a;
}

inline Argument StrArg(std::string name, std::string v) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kString;
  a.s = std::move(v);
  return a;
}

inline Argument NoneArg(std::string name) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kNone;
  return a;
}

inline Argument IntListArg(std::string name, std::vector<int64_t> v) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kIntList;
  a.ints = std::move(v);
  return a;
}

inline OpCase MakeCase(std::string op, std::string overload, std::vector<Argument> args) {
  OpCase c;
  c.op = std::move(op);
  c.overload = std::move(overload);
  c.args = std::move(args);
  return c;
}

// aten::mm(self f32[m,k], mat2 f32[k,n])
inline OpCase MmCase(int64_t m, int64_t k, int64_t n, DType dtype = DType::kFloat32) {
  return MakeCase("aten::mm", "", {TensorArg("self", dtype, {m, k}), TensorArg("mat2", dtype, {k, n})});
}

// aten::add.Tensor(self, other, alpha=1)
inline OpCase AddCase(std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
  return MakeCase("aten::add", "Tensor", {TensorArg("self", dtype, shape), TensorArg("other", dtype, shape), IntArg("alpha", 1)});
}

// aten::mul.Tensor(self, other)
inline OpCase MulCase(std::vector<int64_t> shape, DType dtype = DType::kFloat32) {
  return MakeCase("aten::mul", "Tensor", {TensorArg("self", dtype, shape), TensorArg("other", dtype, shape)});
}

}  // namespace coverage::testing

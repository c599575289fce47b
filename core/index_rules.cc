#include "core/index_rules.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace coverage {
namespace {

int64_t NormaliseDim(int64_t dim, size_t rank) { return dim < 0 ? dim + static_cast<int64_t>(rank) : dim; }

Argument* FindArg(OpCase& c, std::string_view name) {
  for (auto& a : c.args) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

// Gives `index` the whole indexed dimension as its range: [0, size), or
// [-size, size) where negative indices are allowed and were seen.
void IndexWholeDimension(TensorSpec& index, int64_t size, bool allow_negative) {
  if (index.domain.kind != ValueDomain::Kind::kInteger || size <= 0) return;
  index.domain.lo = allow_negative && index.domain.lo < 0 ? -size : 0;
  index.domain.hi = size;
}

}  // namespace

void IndexRules(OpCase& c) {
  auto tensor = [&](std::string_view name) -> TensorSpec* {
    Argument* a = FindArg(c, name);
    return a && a->kind == Argument::Kind::kTensor ? &a->tensor : nullptr;
  };
  auto dim_size = [&](TensorSpec* t, int64_t dim) -> int64_t {
    if (!t || t->shape.empty()) return 0;
    int64_t d = NormaliseDim(dim, t->shape.size());
    return d >= 0 && d < static_cast<int64_t>(t->shape.size()) ? t->shape[d] : 0;
  };
  const std::string& op = c.op;
  if (op == "aten::embedding" || op == "aten::embedding_bag" || op == "aten::_embedding_bag" ||
      op == "aten::_embedding_bag_forward_only") {
    if (auto* idx = tensor("indices")) IndexWholeDimension(*idx, dim_size(tensor("weight"), 0), false);
    return;
  }
  static const char* kDimIndexed[] = {"aten::index_select", "aten::gather",     "aten::scatter",
                                      "aten::scatter_",     "aten::scatter_add", "aten::scatter_add_",
                                      "aten::scatter_reduce", "aten::index_add", "aten::index_add_",
                                      "aten::index_copy",   "aten::index_copy_", "aten::index_fill",
                                      "aten::index_fill_",  "aten::take_along_dim"};
  for (const char* name : kDimIndexed) {
    if (op != name) continue;
    Argument* dim = FindArg(c, "dim");
    TensorSpec* idx = tensor("index");
    if (!idx) idx = tensor("indices");
    int64_t d = dim && dim->kind == Argument::Kind::kInt ? dim->i : 0;
    if (idx) IndexWholeDimension(*idx, dim_size(tensor("self"), d), false);
    return;
  }
  if (op == "aten::index" || op == "aten::index_put" || op == "aten::index_put_" || op == "aten::_index_put_impl_") {
    Argument* indices = FindArg(c, "indices");
    TensorSpec* self = tensor("self");
    if (!indices || !self) return;
    for (size_t i = 0; i < indices->tensors.size(); ++i) {
      auto& t = indices->tensors[i];
      if (t && t->dtype != DType::kBool) IndexWholeDimension(*t, dim_size(self, static_cast<int64_t>(i)), true);
    }
    return;
  }
  if (op == "aten::nll_loss" || op == "aten::nll_loss_nd" || op == "aten::nll_loss2d" ||
      op == "aten::cross_entropy_loss" || op == "aten::nll_loss_forward" || op == "aten::nll_loss2d_forward" ||
      op == "aten::nll_loss_backward" || op == "aten::nll_loss2d_backward") {
    TensorSpec* self = tensor("self");
    TensorSpec* target = tensor("target");
    if (self && target) IndexWholeDimension(*target, dim_size(self, self->shape.size() >= 2 ? 1 : 0), false);
  }
}

std::vector<int64_t> IndexedSizes(const OpCase& op_case) {
  // Every tensor gets the marker range [0, -1); the rules replace the
  // range of those that index a dimension with [0, size).
  OpCase c = op_case;
  auto mark = [](TensorSpec& t) { t.domain = ValueDomain{ValueDomain::Kind::kInteger, 0, -1}; };
  for (auto& a : c.args) {
    if (a.kind == Argument::Kind::kTensor) mark(a.tensor);
    if (a.kind == Argument::Kind::kTensorList) {
      for (auto& t : a.tensors) {
        if (t) mark(*t);
      }
    }
  }
  IndexRules(c);
  std::vector<int64_t> sizes;
  for (const auto& a : c.args) {
    if (a.kind == Argument::Kind::kTensor) sizes.push_back(std::max<int64_t>(a.tensor.domain.hi, 0));
    if (a.kind == Argument::Kind::kTensorList) {
      for (const auto& t : a.tensors) sizes.push_back(t ? std::max<int64_t>(t->domain.hi, 0) : 0);
    }
  }
  return sizes;
}

}  // namespace coverage

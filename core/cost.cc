#include "core/cost.h"

#include <algorithm>
#include <string_view>

namespace coverage {
namespace {

const TensorSpec* Tensor(const OpCase& c, size_t i) {
  size_t seen = 0;
  for (const auto& a : c.args) {
    if (a.kind != Argument::Kind::kTensor) continue;
    if (seen++ == i) return &a.tensor;
  }
  return nullptr;
}

double Prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  double p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= static_cast<double>(v[i]);
  return p;
}

bool IsView(const std::string& op) {
  static constexpr std::string_view kViews[] = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::t", "aten::permute",
      "aten::expand", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::flatten",
      "aten::as_strided", "aten::narrow", "aten::unflatten", "aten::split", "aten::chunk", "aten::unbind",
      "aten::detach", "aten::alias", "aten::view_as", "aten::expand_as", "aten::unfold", "aten::diagonal"};
  for (auto v : kViews) {
    if (op == v) return true;
  }
  return false;
}

bool IsReduction(const std::string& op) {
  static constexpr std::string_view kReductions[] = {
      "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::max", "aten::min", "aten::var", "aten::std",
      "aten::norm", "aten::linalg_vector_norm", "aten::prod", "aten::any", "aten::all", "aten::argmax",
      "aten::argmin", "aten::logsumexp", "aten::softmax", "aten::log_softmax", "aten::_softmax",
      "aten::layer_norm", "aten::native_layer_norm", "aten::batch_norm", "aten::group_norm", "aten::rms_norm",
      "aten::cumsum", "aten::topk", "aten::sort", "aten::adaptive_avg_pool2d", "aten::max_pool2d",
      "aten::avg_pool2d", "aten::nll_loss", "aten::cross_entropy_loss"};
  for (auto v : kReductions) {
    if (op == v) return true;
  }
  return false;
}

}  // namespace

double EstimateReplayBytes(const OpCase& c, double io_bytes) {
  int64_t smallest_float = 0;
  auto see = [&](const TensorSpec& t) {
    if (!IsFloatingDType(t.dtype)) return;
    const int64_t size = DTypeSize(t.dtype);
    if (smallest_float == 0 || size < smallest_float) smallest_float = size;
  };
  c.ForEachTensor(see);
  const double golden = smallest_float > 0 ? io_bytes * 8.0 / static_cast<double>(smallest_float) : 0.0;
  return 3.0 * io_bytes + golden;
}

CostEstimate EstimateCost(const OpCase& c, const std::vector<TensorSpec>& outputs) {
  CostEstimate e;
  double largest = 0;
  auto add_bytes = [&](const TensorSpec& t) {
    e.bytes += static_cast<double>(t.Numel()) * static_cast<double>(DTypeSize(t.dtype));
    largest = std::max(largest, static_cast<double>(t.Numel()));
  };
  c.ForEachTensor(add_bytes);
  double out_numel = 0;
  for (const auto& t : outputs) {
    add_bytes(t);
    out_numel = std::max(out_numel, static_cast<double>(t.Numel()));
  }
  const std::string& op = c.op;
  const TensorSpec* a = Tensor(c, 0);
  const TensorSpec* b = Tensor(c, 1);
  const TensorSpec* third = Tensor(c, 2);
  if ((op == "aten::mm" || op == "aten::matmul" || op == "aten::bmm") && a && b && !a->shape.empty() && !b->shape.empty()) {
    // out has the batch and M, N dims; K is the contracted dim of `a`.
    e.flops = 2.0 * out_numel * static_cast<double>(a->shape.back());
  } else if ((op == "aten::addmm" || op == "aten::baddbmm") && b && !b->shape.empty()) {
    e.flops = 2.0 * out_numel * static_cast<double>(b->shape.back()) + out_numel;
  } else if (op == "aten::addbmm" && b && b->shape.size() == 3) {
    // batch1 [B, N, M] x batch2 [B, M, P] summed over B into [N, P].
    e.flops = 2.0 * out_numel * static_cast<double>(b->shape[0] * b->shape[2]) + out_numel;
  } else if (op == "aten::linear" && a && b && !a->shape.empty()) {
    e.flops = 2.0 * out_numel * static_cast<double>(a->shape.back());
  } else if ((op == "aten::conv1d" || op == "aten::conv2d" || op == "aten::conv3d" || op == "aten::convolution" ||
              op == "aten::_convolution") && b && b->shape.size() >= 3) {
    // weight: [Cout, Cin/groups, k...]; each output element is a dot product.
    e.flops = 2.0 * out_numel * Prod(b->shape, 1, b->shape.size());
  } else if (op == "aten::scaled_dot_product_attention" && a && b && third && a->shape.size() >= 2) {
    const double q = a->shape[a->shape.size() - 2], d = a->shape.back();
    const double k = b->shape.size() >= 2 ? b->shape[b->shape.size() - 2] : 0;
    e.flops = 4.0 * Prod(a->shape, 0, a->shape.size() - 2) * q * k * d;
  } else if (IsView(op)) {
    e.flops = 0;
  } else if (IsReduction(op)) {
    e.flops = std::max(out_numel, largest);
  } else {
    e.flops = outputs.empty() ? largest : out_numel;
  }
  return e;
}

}  // namespace coverage

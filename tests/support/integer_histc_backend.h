// IntegerHistcBackend: a backend with an integer histc kernel, which the
// CPU lacks (Note [Reference upcast] in replay/reference_upcast.cc):
// accelerators have one and transformers' MoE path calls it on int32
// expert ids. Every other op runs on ATen's CPU kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "backends/backend.h"

namespace coverage::testing {

class IntegerHistcBackend final : public backends::Backend {
 public:
  int64_t off_by = 0;  // added to the first bin: a wrong count
  std::string name() const override { return "int-histc"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    if (op.operator_name().name != "aten::histc" || (*stack)[0].toTensor().scalar_type() != at::kInt) {
      op.callBoxed(stack);
      return;
    }
    // An independent integer kernel: counts of each bin over [min, max].
    const at::Tensor in = (*stack)[0].toTensor().contiguous();
    const int64_t bins = (*stack)[1].toInt();
    const double lo = (*stack)[2].toScalar().toDouble(), hi = (*stack)[3].toScalar().toDouble();
    at::Tensor out = at::zeros({bins}, at::kInt);
    const int32_t* x = in.data_ptr<int32_t>();
    int32_t* o = out.data_ptr<int32_t>();
    for (int64_t i = 0; i < in.numel(); ++i) {
      if (x[i] < lo || x[i] > hi) continue;
      int64_t b = static_cast<int64_t>((x[i] - lo) * bins / (hi - lo));
      o[std::min(b, bins - 1)] += 1;
    }
    o[0] += static_cast<int32_t>(off_by);
    stack->clear();
    stack->emplace_back(out);
  }
};

}  // namespace coverage::testing

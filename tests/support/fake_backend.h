// FakeBackend: a fault-injecting backend for tests. It runs ops on ATen's CPU
// kernels and then breaks chosen ops on purpose: wrong values, NaN, a wrong
// shape, an exception, or "no kernel"; or computes chosen ops with narrower
// operands, as a backend with declared numerics does.
#pragma once

#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

#include "backends/backend.h"

namespace coverage::testing {

class FakeBackend final : public backends::Backend {
 public:
  // Keys are qualified op names ("aten::mul.Tensor") or bare names ("aten::mul").
  std::map<std::string, double> add_offset;     // floating outputs += offset
  std::set<std::string> make_nan;               // first output element becomes NaN
  std::set<std::string> drop_last_row;          // outputs lose their last row (shape mismatch)
  std::map<std::string, std::string> throw_message;  // throws std::runtime_error(message)
  std::set<std::string> unsupported;            // throws like a dispatcher without a kernel
  std::set<std::string> scribble_inputs;        // writes zeros into its first tensor input
  // Its fp32 tensor inputs rounded to this many mantissa bits before the op
  // runs (7: bf16, 10: TF32; fewer: worse than either).
  std::map<std::string, int> operand_mantissa_bits;
  std::string numerics;                          // what Numerics() declares
  // Right for this many executions of the op, then outputs += 0.5 (a kernel
  // that goes wrong on warm calls).
  std::map<std::string, int> right_for_calls;
  std::map<std::string, double> scale_outputs;  // floating outputs *= factor (a relative error)
  // An in-place op that does nothing when one of its scalar arguments is
  // this value (an AdamW step without its weight decay: the foreach mul by
  // 1 - lr * weight_decay skipped).
  std::map<std::string, double> skip_when_scalar;
  std::map<std::string, int> executions_of;
  int executions = 0;

  std::string Numerics() const override { return numerics; }

  // `t` (fp32) rounded to `bits` mantissa bits, to nearest even.
  static at::Tensor RoundMantissa(const at::Tensor& t, int bits) {
    const int drop = 23 - bits;
    const at::Tensor b = t.contiguous().view(at::kInt);
    const at::Tensor lsb = b.bitwise_right_shift(drop).bitwise_and(1);
    const at::Tensor kept = (b + ((1 << (drop - 1)) - 1) + lsb).bitwise_and(~((1 << drop) - 1)).view(at::kFloat);
    return at::where(t.isfinite(), kept.view(t.sizes()), t);
  }

  std::string name() const override { return "fake"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }

  void Execute(const c10::OperatorHandle& op, torch::jit::Stack* stack) override {
    ++executions;
    const auto& n = op.operator_name();
    const std::string bare = n.name;
    const std::string qualified = n.overload_name.empty() ? bare : bare + "." + n.overload_name;
    auto has = [&](const auto& container) { return container.count(qualified) || container.count(bare); };
    const int nth = ++executions_of[qualified];
    if (has(unsupported)) {
      throw std::runtime_error("Could not run '" + qualified + "' with arguments from the 'Fake' backend.");
    }
    if (has(throw_message)) {
      throw std::runtime_error(throw_message.count(qualified) ? throw_message.at(qualified) : throw_message.at(bare));
    }
    if (has(scribble_inputs)) {
      for (auto& v : *stack) {
        if (v.isTensor()) {
          v.toTensor().zero_();
          break;
        }
      }
    }
    if (has(skip_when_scalar)) {
      const double value = skip_when_scalar.count(qualified) ? skip_when_scalar.at(qualified) : skip_when_scalar.at(bare);
      for (const auto& v : *stack) {
        if (v.isDouble() && v.toDouble() == value) {
          stack->clear();  // the in-place foreach ops return nothing
          return;
        }
      }
    }
    if (has(operand_mantissa_bits)) {
      const int bits = operand_mantissa_bits.count(qualified) ? operand_mantissa_bits.at(qualified)
                                                              : operand_mantissa_bits.at(bare);
      for (auto& v : *stack) {
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().scalar_type() == at::kFloat) {
          v = RoundMantissa(v.toTensor(), bits);
        }
      }
    }
    op.callBoxed(stack);
    for (auto& v : *stack) {
      if (!v.isTensor()) continue;
      at::Tensor t = v.toTensor();
      if (has(right_for_calls) && t.is_floating_point() &&
          nth > (right_for_calls.count(qualified) ? right_for_calls.at(qualified) : right_for_calls.at(bare))) {
        v = t + 0.5;
        continue;
      }
      if (has(scale_outputs) && t.is_floating_point()) {
        v = t * (scale_outputs.count(qualified) ? scale_outputs.at(qualified) : scale_outputs.at(bare));
      }
      if (has(add_offset) && t.is_floating_point()) {
        double off = add_offset.count(qualified) ? add_offset.at(qualified) : add_offset.at(bare);
        v = t + off;
      }
      if (has(make_nan)) {
        at::Tensor c = t.clone();
        c.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
        v = c;
      }
      if (has(drop_last_row)) v = t.narrow(0, 0, t.size(0) - 1);
    }
  }
};

}  // namespace coverage::testing

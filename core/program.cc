#include "core/program.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace coverage {

ProgramFootprint EstimateFootprint(const Program& program) {
  ProgramFootprint f;
  auto bytes_of = [](const TensorSpec& t) {
    return static_cast<double>(t.StorageNumel()) * static_cast<double>(DTypeSize(t.dtype));
  };
  struct Life {
    int64_t born = -1, last = -1;
    double bytes = 0;
  };
  std::unordered_map<int64_t, Life> lives;
  for (const auto& v : program.values) {
    if (!v.tensor) continue;
    lives[v.id].bytes = bytes_of(*v.tensor);
    f.leaf_bytes += lives[v.id].bytes;
  }
  for (const auto& c : program.calls) {
    if (c.op_case) f.flops += EstimateCost(*c.op_case, c.output_specs).flops;
    // Tensor arguments in schema order, as `inputs` lists their ids.
    std::vector<const TensorSpec*> specs;
    if (c.op_case) {
      for (const auto& a : c.op_case->args) {
        if (a.kind == Argument::Kind::kTensor) specs.push_back(&a.tensor);
        if (a.kind == Argument::Kind::kTensorList) {
          for (const auto& t : a.tensors) specs.push_back(t ? &*t : nullptr);
        }
      }
    }
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const int64_t id = c.inputs[i];
      if (id < 0) continue;
      Life& l = lives[id];
      if (l.born < 0) l.born = c.index;
      l.last = c.index;
      if (l.bytes == 0 && i < specs.size() && specs[i]) l.bytes = bytes_of(*specs[i]);
    }
    for (int64_t id : c.outputs) {
      if (id >= 0 && lives[id].born < 0) lives[id].born = c.index;
    }
  }
  // Sweep: +bytes at birth, -bytes after the last read.
  std::map<int64_t, double> delta;
  for (const auto& [id, l] : lives) {
    if (l.last < 0 || l.bytes == 0) continue;
    delta[l.born] += l.bytes;
    delta[l.last + 1] -= l.bytes;
  }
  double live = 0;
  for (const auto& [at, d] : delta) {
    live += d;
    f.peak_bytes = std::max(f.peak_bytes, live);
  }
  return f;
}

}  // namespace coverage

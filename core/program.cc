#include "core/program.h"

namespace coverage {

ProgramFootprint EstimateFootprint(const Program& program) {
  ProgramFootprint f;
  for (const auto& v : program.values) {
    if (v.tensor) f.leaf_bytes += static_cast<double>(v.tensor->StorageNumel()) * static_cast<double>(DTypeSize(v.tensor->dtype));
  }
  for (const auto& c : program.calls) {
    if (c.op_case) f.flops += EstimateCost(*c.op_case, c.output_specs).flops;
  }
  return f;
}

}  // namespace coverage

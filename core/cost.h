// Cost estimates for an op call, from its arguments and output specs.
// Matrix products and convolutions count 2 FLOPs per multiply-add;
// reductions and normalisations one per input element; views (view, slice,
// transpose, expand, ...) none; everything else (elementwise, gathers such as
// embedding, copies) one per output element. Bytes are the logical sizes of
// all tensor inputs and outputs.
#pragma once

#include <vector>

#include "core/op_case.h"

namespace coverage {

struct CostEstimate {
  double flops = 0;
  double bytes = 0;
};

CostEstimate EstimateCost(const OpCase& op_case, const std::vector<TensorSpec>& outputs);

}  // namespace coverage

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

// Peak bytes the unit stage's replay of a case holds, from its inputs and
// outputs (`io_bytes`, CostEstimate::bytes): the materialised inputs, the
// reference's and the backend's inputs and outputs (3x), and, for a case
// with floating tensors, the fp64 golden's (io_bytes x 8 / the smallest
// floating element size: 2x for f32, 4x for bf16). The golden runs only on a
// miss, but a cap has to hold when it does.
double EstimateReplayBytes(const OpCase& op_case, double io_bytes);

}  // namespace coverage

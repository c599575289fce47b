#include "replay/model_check.h"

#include "core/json_double.h"

namespace coverage::replay {

// Note [Model verdicts]
// ~~~~~~~~~~~~~~~~~~~~~
// module, model: the backend's outputs are judged like unit-stage outputs
// (Note [Tolerances]: the dtype's assert_close tolerance, or at most the
// multiplier times the CPU's own error against an fp64 golden replay of the
// same program), and in addition
//   - the cosine similarity of the flattened outputs must reach min_cosine
//     (0.99): a backend can be "as inexact as the CPU" element-wise on a
//     handful of values and still have turned the output around. It is
//     judged only for outputs with elements outside the reference
//     tolerance: one within it everywhere (a layer norm's saved mean, whose
//     values are at rounding level) has no direction to lose;
//   - for language-model logits, the backend's top-1 token must be among
//     the reference's top-k (5) at min_topk_agreement (99%) of positions.
//     Random weights make near-ties common, so exact top-1 agreement
//     (reported) would fail correct backends.
// Per-check tolerance overrides use the op names "module::<kind>" and
// "model::forward" in configs/tolerances.json.
//
// train: the captured step (forward, the library's loss, backward and the
// optimizer as PyTorch ran it) replayed N times on the backend, parameters
// carried over. Judged per step: the loss, and every parameter's gradient
// norm, within a relative tolerance of the reference's; after the last step
// the parameters' distance from the reference's, relative to how far the
// reference's moved. Gradient norms carry the check: Adam's update is nearly
// invariant to a gradient's scale, so a wrong gradient can leave the
// parameters close while its norm is off. A parameter whose gradient norm is
// below a millionth of the step's total holds rounding noise only (a device
// whose ATen decompositions differ from the CPU's shows 1.7e-13 against
// 2.4e-13): its difference is taken relative to that millionth.

// Note [Reproducible training]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Training a randomly initialised model can be chaotic: gradient norms that
// grow by orders of magnitude in a step turn the last-bit differences of
// multithreaded CPU reductions into different losses, so two runs of the
// reference itself disagree. As the unit stage judges a backend against the
// CPU's own error, a training run that misses the fixed tolerances is judged
// again against a second reference run: each tolerance becomes at least the
// comparison multiplier (2x) times the reference's own run-to-run
// difference. A reproducible reference (the usual case) leaves them as
// they are; the details record the reference's reproducibility. When the
// reference disagrees with itself beyond the fixed tolerances and the backend
// still misses the widened ones, there is no verdict: the item is skipped
// with both differences, rather than blamed on the backend.

}  // namespace coverage::replay

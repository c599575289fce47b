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
//     A position counts against it only where the reference ranks the
//     backend's token below its k-th by more than twice the logits'
//     tolerance (the dtype's, or the multiplier times the CPU's own error
//     against the golden): closer, the tokens are tied within tolerance.
// Per-check tolerance overrides use the op names "module::<kind>" and
// "model::forward" in configs/tolerances.json.

// Note [By-products]
// ~~~~~~~~~~~~~~~~~~
// The outputs judged are the values nothing in the program reads, less the
// by-products: a secondary output nothing reads of a call whose first
// output is read on. In inference a layer norm's saved mean and rstd are
// such (only its backward would read them); their error is relative to
// the scale of the normalised row, not their own near-zero value, so
// judged alone they fail correct backends ("1 of 1 elements" of whisper's
// last saved mean, 53x the CPU's error of 8e-7 on a value of -0.025).
// They are counted in the details (by_products_not_judged); the unit stage
// judges every output of the op itself, and the train stage reads them.

// Note [Training verdicts]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// The train stage replays the captured step (forward, the library's loss,
// backward and the optimizer as PyTorch ran it) N times, parameters carried
// over, and judges three quantities: each step's loss, each step's gradient
// norms (one per parameter, as a vector: their distance over their size,
// so a gradient at rounding level or one whose relative error is an
// extreme draw among hundreds weighs as little as it matters to the step;
// the one most off is named), and the parameters after the last step
// (their distance over how far training moved them). Gradient norms carry
// the check: Adam's update is nearly invariant to a gradient's scale, so a
// wrong gradient can leave the parameters close while its norm is off.
//
// The tolerances are derived, as the unit stage's are (Note [Tolerances]):
//   1. within the parameters' dtype tolerance of the reference (rtol of
//      configs/tolerances.json's "train::step" or the dtype's) everywhere:
//      pass, nothing more to learn;
//   2. otherwise the same N steps in fp64 on the CPU (the golden) and each
//      quantity's difference from the golden, the backend's against the
//      reference's own: the backend passes where it is within the
//      multiplier (2x; a backend that declares bf16 or TF32 matmul
//      operands trains with their noise and gets bf16's or f16's, 3x) of
//      the reference's error or within the dtype tolerance of the golden.
//      Each quantity over the run is one tensor,
//      as a unit-stage output is (the losses of all steps, the gradient
//      norms of all steps): the backend's error at each step against the
//      reference's largest. A single step's loss error is one random draw
//      of the rounding; the reference's can be near zero by chance (1e-6
//      against the backend's 2e-5 at step 0, 3e-4 against 1e-4 at step 2,
//      on the same correct run). The reference computes the way the backend
//      declares (Note [Declared numerics]), so a backend with bf16 matmul
//      operands is judged against a reference with them, and both against
//      exact arithmetic.
// So a fixed tolerance does not hide small real faults (an AdamW step
// without its weight decay moves the parameters 0.1-1% of their update
// off; an rsqrt 1e-4 off moves every gradient norm about as much; the CPU's
// own error is 1e-6 of that), and a chaotic training run (gradient norms
// that grow by orders of magnitude, where the CPU's own last-bit
// differences grow with them) widens the tolerance exactly as much as the
// reference itself strays. `--golden never` keeps step 1 only.

}  // namespace coverage::replay

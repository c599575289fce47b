// Ops of this project that programs record in place of a composite's
// backward (Note [Composites recorded whole] in composites.cc). Registered
// with the dispatcher when this library is linked; torch-free header.
#pragma once

namespace coverage::replay {

// The dispatcher name of the backward of scaled_dot_product_attention as
// programs record it.
inline constexpr const char* kAttentionBackwardOp = "coverage::scaled_dot_product_attention_backward";

// Registers the coverage:: ops (once; later calls do nothing). Everything
// that looks ops up by name (unit replay, program replay) calls it first.
void RegisterCompositeOps();

}  // namespace coverage::replay

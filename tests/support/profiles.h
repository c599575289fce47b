// Small input profiles for builder tests: a 16-token prefill and a decode
// step of 2 sequences over a 15-token KV cache.
#pragma once

#include <cstdint>

#include "runners/blocks.h"

namespace coverage::testing {

inline runners::CaptureProfile Prefill(int64_t tokens = 16) {
  runners::CaptureProfile p;
  p.name = "prefill";
  p.batch = 1;
  p.seq_len = tokens;
  return p;
}

inline runners::CaptureProfile Decode() {
  runners::CaptureProfile p;
  p.name = "decode";
  p.batch = 2;
  p.seq_len = 1;
  p.past_len = 15;
  return p;
}

}  // namespace coverage::testing

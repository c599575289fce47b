// Small, stable, non-cryptographic hashes (the same on every platform and
// run): for deterministic tie-breaks and seeded picks, never for security.
#pragma once

#include <cstdint>
#include <string_view>

namespace coverage {

// FNV-1a, 64 bits.
inline uint64_t Fnv1a64(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// A bijective 64-bit mixer (MurmurHash3's finaliser).
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

}  // namespace coverage

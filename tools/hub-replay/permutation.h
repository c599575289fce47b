// Deterministic hashing and index permutations for synthetic hubs: every
// property of synthetic model i is a pure function of (seed, i), computed in
// O(1) without per-model storage.
//
// Thread safety: all functions are pure; an IndexPermutation is immutable
// after construction and may be shared between threads.
#pragma once

#include <cstdint>
#include <string>

namespace coverage::hub_replay {

// The splitmix64 finalizer: a bijective 64-bit mixer with good avalanche.
uint64_t Mix64(uint64_t x);

// A well-mixed 64-bit value for (seed, a, b); distinct salts b give
// independent streams for the same (seed, a).
uint64_t HashOf(uint64_t seed, uint64_t a, uint64_t b);

// The top 53 bits of h as a double in [0, 1).
double UnitInterval(uint64_t h);

// The low 4·digits bits of v as `digits` lower-case hex digits.
std::string HexDigits(uint64_t v, int digits);

// A keyed bijection of [0, n) onto itself (a 4-round balanced Feistel network
// on the smallest even bit width that holds n, with cycle walking), so that
// Forward and Inverse each cost O(1) expected time (under 4 network
// evaluations on average) and no table is stored.
class IndexPermutation {
 public:
  // n >= 1 and n <= 2^62.
  IndexPermutation(uint64_t n, uint64_t key);

  uint64_t size() const { return n_; }
  uint64_t Forward(uint64_t x) const;  // x < size()
  uint64_t Inverse(uint64_t y) const;  // y < size()

 private:
  uint64_t Round(uint64_t half, int round) const;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t Decrypt(uint64_t y) const;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[4];
};

}  // namespace coverage::hub_replay

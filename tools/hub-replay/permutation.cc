#include "tools/hub-replay/permutation.h"

#include "core/check.h"

namespace coverage::hub_replay {

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t HashOf(uint64_t seed, uint64_t a, uint64_t b) {
  return Mix64(Mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ Mix64(a + 0x3c6ef372fe94f82bULL) ^
               Mix64(b * 0xa54ff53a5f1d36f1ULL));
}

double UnitInterval(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

std::string HexDigits(uint64_t v, int digits) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = kDigits[v & 15];
  return out;
}

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n) {
  COV_CHECK(n >= 1 && n <= (uint64_t{1} << 62), "permutation size out of range");
  half_bits_ = 1;
  while ((uint64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int i = 0; i < 4; ++i) keys_[i] = HashOf(key, 0x5045524dULL, static_cast<uint64_t>(i));
}

uint64_t IndexPermutation::Round(uint64_t half, int round) const { return Mix64(half ^ keys_[round]) & half_mask_; }

uint64_t IndexPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < 4; ++r) {
    const uint64_t next = left ^ Round(right, r);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::Decrypt(uint64_t y) const {
  uint64_t left = y >> half_bits_, right = y & half_mask_;
  for (int r = 3; r >= 0; --r) {
    const uint64_t prev = right ^ Round(left, r);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

// Cycle walking: the network permutes [0, 4^half_bits), which holds n; values
// outside [0, n) are encrypted again until they land inside. Because the
// network is a bijection, this stays a bijection on [0, n).
uint64_t IndexPermutation::Forward(uint64_t x) const {
  COV_CHECK(x < n_, "permutation input out of range");
  uint64_t y = Encrypt(x);
  while (y >= n_) y = Encrypt(y);
  return y;
}

uint64_t IndexPermutation::Inverse(uint64_t y) const {
  COV_CHECK(y < n_, "permutation input out of range");
  uint64_t x = Decrypt(y);
  while (x >= n_) x = Decrypt(x);
  return x;
}

}  // namespace coverage::hub_replay

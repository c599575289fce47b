// Choosing K representative models that together cover the design space.
//
// Note [Selection]
// Each model is a point: its coarse signature (Note [Signatures]), its
// dtype, and a vector of its dimensions, each as log2(1 + x) divided by the
// largest such value in the population (so every coordinate lies in [0, 1]).
// Distance between two models: Euclidean over the vector, plus 1 (inside the
// square root) when the dtypes differ; models of different coarse signatures
// are kCrossSignatureDistance apart, more than any two vectors can be.
//
// Models with identical points are merged first (a Hub population repeats
// the same config thousands of times), so the work grows with the number of
// distinct points, not with the number of models.
//
// 1. Coverage of families: every coarse signature gets one representative,
//    its most downloaded model. If K is smaller than the number of coarse
//    signatures, the signatures with the most downloads in total come first
//    and a warning says how many were left out.
// 2. The rest of the budget goes to farthest-point k-center: the next
//    representative is the point farthest from every representative so far.
//    Among equivalent candidates (same fine signature as that point) the most
//    downloaded model wins, so a popular real model stands for its variants.
//    Exact distance ties go to the fine signature with the most downloads,
//    then to the order a hash of (seed, fine signature) gives.
// 3. Every model is assigned to its nearest representative (ties: the
//    earlier one), which it "stands for".
//
// Deterministic: the same population, K and seed give the same result,
// whatever the thread count. Parallel with TBB.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "selection/features.h"

namespace coverage::selection {

inline constexpr double kCrossSignatureDistance = 10.0;
inline constexpr int kDimensions = 18;

// The population, compacted as it is added: a few dozen bytes per model plus
// one entry per distinct point. Not thread-safe while adding.
class Population {
 public:
  Population();
  ~Population();
  Population(Population&&) noexcept;
  Population& operator=(Population&&) noexcept;

  void Add(std::string_view id, int64_t downloads, const Features& features);

  size_t size() const;
  size_t distinct_points() const;
  size_t coarse_signatures() const;
  size_t fine_signatures() const;

  std::string_view id(size_t model) const;
  int64_t downloads(size_t model) const;
  const std::string& coarse(size_t model) const;
  const std::string& fine(size_t model) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct Representative {
  size_t model = 0;  // index in the Population
  int rank = 0;      // 1 = chosen first
  std::string reason;
  double distance_when_chosen = 0;  // phase 2: from it to the nearest earlier representative
  int64_t stands_for = 0;            // models assigned to it (itself included)
  int64_t downloads_represented = 0;
};

struct Coverage {
  int64_t models = 0;
  int64_t distinct_points = 0;
  int64_t coarse_total = 0, coarse_covered = 0;
  int64_t fine_total = 0, fine_covered = 0;
  int64_t downloads_total = 0;
  // Downloads of models whose fine signature has a representative.
  int64_t downloads_equivalent = 0;
  double mean_distance = 0;  // over models, to their nearest representative
  double max_distance = 0;
};

struct Selection {
  std::vector<Representative> representatives;
  std::vector<uint32_t> nearest;  // per model: index into representatives
  std::vector<float> distance;    // per model: distance to it
  Coverage coverage;
  std::vector<std::string> warnings;
};

// Errors: InvalidArgument when k < 1 or the population is empty.
Result<Selection> Select(const Population& population, int k, uint64_t seed);

// One plain farthest-point pass over every model (no merging, no
// signatures, O(N·K·D)): the reference the benchmark compares Select with.
// Returns the chosen model indices.
std::vector<size_t> PlainFarthestPoint(const Population& population, int k);

}  // namespace coverage::selection

#include "selection/selection.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include "core/check.h"
#include "core/hash.h"
#include "selection/signature.h"

namespace coverage::selection {

namespace {

// The dimensions of Note [Selection], in a fixed order.
std::array<int64_t, kDimensions> Dims(const Features& f) {
  return {f.hidden,   f.layers,          f.encoder_layers, f.heads,          f.kv_heads,   f.head_dim,
          f.intermediate, f.vocab,       f.context,        f.experts,        f.experts_per_token, f.sliding_window,
          f.image_size, f.patch_size,    f.vision.hidden,  f.vision.layers,  f.audio.hidden, f.audio.layers};
}

struct PointKey {
  uint32_t coarse;
  uint32_t dtype;
  std::array<int64_t, kDimensions> dims;
  bool operator==(const PointKey&) const = default;
};

struct PointKeyHash {
  size_t operator()(const PointKey& k) const {
    uint64_t h = 1469598103934665603ull ^ (uint64_t{k.coarse} << 20) ^ k.dtype;
    for (int64_t d : k.dims) h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ull;
    return static_cast<size_t>(h ^ (h >> 29));
  }
};

uint32_t Intern(const std::string& s, std::vector<std::string>& table, std::unordered_map<std::string, uint32_t>& ids) {
  auto [it, inserted] = ids.try_emplace(s, static_cast<uint32_t>(table.size()));
  if (inserted) table.push_back(s);
  return it->second;
}


}  // namespace

struct Population::Impl {
  // Models.
  std::string id_blob;
  std::vector<uint64_t> id_end;  // id i is id_blob[id_end[i-1], id_end[i])
  std::vector<int64_t> downloads;
  std::vector<uint32_t> point_of;
  // Distinct points.
  std::vector<PointKey> keys;
  std::vector<uint32_t> fine_of;  // per point
  std::unordered_map<PointKey, uint32_t, PointKeyHash> point_ids;
  // Interned strings.
  std::vector<std::string> coarse, fine, dtypes;
  std::unordered_map<std::string, uint32_t> coarse_ids, fine_ids, dtype_ids;

  std::string_view Id(size_t m) const {
    const uint64_t begin = m == 0 ? 0 : id_end[m - 1];
    return std::string_view(id_blob).substr(begin, id_end[m] - begin);
  }

  // log2(1 + x) / scale per dimension, for every point (row-major).
  std::vector<float> Normalised() const {
    std::array<double, kDimensions> scale{};
    for (const PointKey& k : keys) {
      for (int d = 0; d < kDimensions; ++d) scale[d] = std::max(scale[d], std::log2(1.0 + static_cast<double>(k.dims[d])));
    }
    std::vector<float> out(keys.size() * kDimensions);
    for (size_t p = 0; p < keys.size(); ++p) {
      for (int d = 0; d < kDimensions; ++d) {
        out[p * kDimensions + d] =
            scale[d] > 0 ? static_cast<float>(std::log2(1.0 + static_cast<double>(keys[p].dims[d])) / scale[d]) : 0.f;
      }
    }
    return out;
  }
};

namespace {

// The distance of Note [Selection] between points a and b.
double PointDistance(const Population::Impl& im, const std::vector<float>& x, size_t a, size_t b) {
  const float* u = &x[a * kDimensions];
  const float* v = &x[b * kDimensions];
  double s = im.keys[a].dtype == im.keys[b].dtype ? 0.0 : 1.0;
  for (int d = 0; d < kDimensions; ++d) {
    const double t = static_cast<double>(u[d]) - static_cast<double>(v[d]);
    s += t * t;
  }
  const double dist = std::sqrt(s);
  return im.keys[a].coarse == im.keys[b].coarse ? dist : kCrossSignatureDistance + dist;
}

}  // namespace

Population::Population() : impl_(std::make_unique<Impl>()) {}
Population::~Population() = default;
Population::Population(Population&&) noexcept = default;
Population& Population::operator=(Population&&) noexcept = default;

void Population::Add(std::string_view id, int64_t downloads, const Features& features) {
  Impl& im = *impl_;
  PointKey key{Intern(CoarseSignature(features), im.coarse, im.coarse_ids),
               Intern(features.dtype, im.dtypes, im.dtype_ids), Dims(features)};
  for (int64_t& d : key.dims) d = std::max<int64_t>(d, 0);
  auto [it, inserted] = im.point_ids.try_emplace(key, static_cast<uint32_t>(im.keys.size()));
  if (inserted) {
    im.keys.push_back(key);
    im.fine_of.push_back(Intern(FineSignature(features), im.fine, im.fine_ids));
  }
  im.id_blob.append(id);
  im.id_end.push_back(im.id_blob.size());
  im.downloads.push_back(std::max<int64_t>(downloads, 0));
  im.point_of.push_back(it->second);
}

size_t Population::size() const { return impl_->downloads.size(); }
size_t Population::distinct_points() const { return impl_->keys.size(); }
size_t Population::coarse_signatures() const { return impl_->coarse.size(); }
size_t Population::fine_signatures() const { return impl_->fine.size(); }
std::string_view Population::id(size_t model) const { return impl_->Id(model); }
int64_t Population::downloads(size_t model) const { return impl_->downloads[model]; }
const std::string& Population::coarse(size_t model) const {
  return impl_->coarse[impl_->keys[impl_->point_of[model]].coarse];
}
const std::string& Population::fine(size_t model) const { return impl_->fine[impl_->fine_of[impl_->point_of[model]]]; }

Result<Selection> Select(const Population& population, int k, uint64_t seed) {
  if (k < 1) return Status::InvalidArgument("--k must be at least 1, not " + std::to_string(k));
  if (population.size() == 0) return Status::InvalidArgument("no models to select from (the population is empty)");
  const Population::Impl& im = population.impl();
  const size_t n = im.downloads.size(), u = im.keys.size();
  const std::vector<float> x = im.Normalised();

  // Better model: more downloads, then the smaller id.
  auto better = [&](size_t a, size_t b) {
    if (im.downloads[a] != im.downloads[b]) return im.downloads[a] > im.downloads[b];
    return im.Id(a) < im.Id(b);
  };
  constexpr size_t kNone = std::numeric_limits<size_t>::max();

  // Aggregates per point, fine and coarse signature.
  std::vector<size_t> point_best(u, kNone);
  std::vector<int64_t> point_count(u, 0);
  std::vector<int64_t> fine_downloads(im.fine.size(), 0), coarse_downloads(im.coarse.size(), 0);
  std::vector<int64_t> fine_count(im.fine.size(), 0), coarse_count(im.coarse.size(), 0);
  for (size_t m = 0; m < n; ++m) {
    const uint32_t p = im.point_of[m];
    if (point_best[p] == kNone || better(m, point_best[p])) point_best[p] = m;
    ++point_count[p];
    fine_downloads[im.fine_of[p]] += im.downloads[m];
    ++fine_count[im.fine_of[p]];
    coarse_downloads[im.keys[p].coarse] += im.downloads[m];
    ++coarse_count[im.keys[p].coarse];
  }
  std::vector<std::vector<uint32_t>> coarse_points(im.coarse.size()), fine_points(im.fine.size());
  for (size_t p = 0; p < u; ++p) {
    coarse_points[im.keys[p].coarse].push_back(static_cast<uint32_t>(p));
    fine_points[im.fine_of[p]].push_back(static_cast<uint32_t>(p));
  }
  auto best_of = [&](const std::vector<uint32_t>& points) {
    size_t best = kNone;
    for (uint32_t p : points) {
      if (best == kNone || better(point_best[p], best)) best = point_best[p];
    }
    return best;
  };

  Selection out;
  std::vector<double> mind(u, std::numeric_limits<double>::infinity());
  std::vector<char> is_center(u, 0);
  std::vector<uint32_t> centers;  // points, in rank order
  std::vector<std::vector<uint32_t>> coarse_centers(im.coarse.size());

  // Group maxima of mind, kept current as centers are added.
  struct GroupMax {
    double dist = -1;
    uint32_t point = 0;
  };
  std::vector<GroupMax> group_max(im.coarse.size());
  std::vector<uint64_t> fine_tiebreak(im.fine.size());
  for (size_t f = 0; f < im.fine.size(); ++f) fine_tiebreak[f] = Mix64(seed ^ SignatureHash(im.fine[f]));
  // Is point a a better farthest candidate than b at equal distance?
  auto candidate_before = [&](uint32_t a, uint32_t b) {
    const uint32_t fa = im.fine_of[a], fb = im.fine_of[b];
    if (fine_downloads[fa] != fine_downloads[fb]) return fine_downloads[fa] > fine_downloads[fb];
    if (fine_tiebreak[fa] != fine_tiebreak[fb]) return fine_tiebreak[fa] < fine_tiebreak[fb];
    return a < b;
  };
  auto refresh_group = [&](uint32_t g) {
    GroupMax gm;
    for (uint32_t p : coarse_points[g]) {
      if (mind[p] > gm.dist || (mind[p] == gm.dist && candidate_before(p, gm.point))) gm = {mind[p], p};
    }
    group_max[g] = gm;
  };
  auto add_center = [&](uint32_t c, std::string reason, double at) {
    is_center[c] = 1;
    centers.push_back(c);
    const uint32_t g = im.keys[c].coarse;
    coarse_centers[g].push_back(c);
    const std::vector<uint32_t>& members = coarse_points[g];
    auto update = [&](size_t i) {
      const uint32_t p = members[i];
      mind[p] = std::min(mind[p], PointDistance(im, x, p, c));
    };
    if (members.size() > 4096) {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, members.size(), 1024), [&](const tbb::blocked_range<size_t>& r) {
        for (size_t i = r.begin(); i < r.end(); ++i) update(i);
      });
    } else {
      for (size_t i = 0; i < members.size(); ++i) update(i);
    }
    refresh_group(g);
    Representative rep;
    rep.model = point_best[c];
    rep.rank = static_cast<int>(centers.size());
    rep.reason = std::move(reason);
    rep.distance_when_chosen = at;
    out.representatives.push_back(std::move(rep));
  };

  // Phase 1: one representative per coarse signature, most downloads first.
  std::vector<uint32_t> groups(im.coarse.size());
  std::iota(groups.begin(), groups.end(), 0u);
  std::sort(groups.begin(), groups.end(), [&](uint32_t a, uint32_t b) {
    if (coarse_downloads[a] != coarse_downloads[b]) return coarse_downloads[a] > coarse_downloads[b];
    return im.coarse[a] < im.coarse[b];
  });
  const size_t phase1 = std::min(groups.size(), static_cast<size_t>(k));
  for (size_t i = 0; i < phase1; ++i) {
    const uint32_t g = groups[i];
    const size_t m = best_of(coarse_points[g]);
    add_center(im.point_of[m],
               "covers coarse signature " + im.coarse[g] + ": the most downloaded of its " +
                   std::to_string(coarse_count[g]) + " models",
               0);
  }
  if (phase1 < groups.size()) {
    int64_t left_downloads = 0, left_models = 0;
    for (size_t i = phase1; i < groups.size(); ++i) {
      left_downloads += coarse_downloads[groups[i]];
      left_models += coarse_count[groups[i]];
    }
    out.warnings.push_back("k = " + std::to_string(k) + " is smaller than the " + std::to_string(groups.size()) +
                           " coarse signatures: the " + std::to_string(groups.size() - phase1) +
                           " with the fewest downloads (" + std::to_string(left_models) + " models, " +
                           std::to_string(left_downloads) + " downloads) have no representative");
  }

  // Phase 2: farthest-point k-center within the covered signatures.
  while (centers.size() < static_cast<size_t>(k)) {
    GroupMax far;
    bool found = false;
    for (uint32_t g : groups) {
      const GroupMax& gm = group_max[g];
      if (coarse_centers[g].empty() || gm.dist <= 0) continue;
      if (!found || gm.dist > far.dist || (gm.dist == far.dist && candidate_before(gm.point, far.point))) {
        far = gm;
        found = true;
      }
    }
    if (!found) {
      out.warnings.push_back("every one of the " + std::to_string(u) + " distinct models is a representative; " +
                             std::to_string(k - static_cast<int>(centers.size())) + " of k = " + std::to_string(k) +
                             " left unused");
      break;
    }
    // Among the equivalent points (same fine signature, not yet chosen), the
    // one with the most downloaded model.
    const uint32_t f = im.fine_of[far.point];
    uint32_t chosen = far.point;
    for (uint32_t p : fine_points[f]) {
      if (!is_center[p] && better(point_best[p], point_best[chosen])) chosen = p;
    }
    char dist[96];
    std::snprintf(dist, sizeof dist, "%.4f", far.dist);
    std::string reason = std::string("farthest from the chosen set: ") + std::string(im.Id(point_best[far.point])) +
                         " (distance " + dist + "); ";
    reason += chosen == far.point ? "it is " : "represented by ";
    reason += "the most downloaded of the " + std::to_string(fine_count[f]) + " models of its fine signature " + im.fine[f];
    add_center(chosen, std::move(reason), mind[chosen]);
  }

  // Assignment: every point to its nearest representative.
  std::vector<uint32_t> point_rep(u);
  std::vector<double> point_dist(u);
  std::vector<uint32_t> rank_of(u, 0);
  for (size_t r = 0; r < centers.size(); ++r) rank_of[centers[r]] = static_cast<uint32_t>(r);
  tbb::parallel_for(tbb::blocked_range<size_t>(0, u, 256), [&](const tbb::blocked_range<size_t>& range) {
    for (size_t p = range.begin(); p < range.end(); ++p) {
      const std::vector<uint32_t>& own = coarse_centers[im.keys[p].coarse];
      const std::vector<uint32_t>& pool = own.empty() ? centers : own;
      double best = std::numeric_limits<double>::infinity();
      uint32_t best_rank = 0;
      for (uint32_t c : pool) {
        const double d = PointDistance(im, x, p, c);
        if (d < best || (d == best && rank_of[c] < best_rank)) {
          best = d;
          best_rank = rank_of[c];
        }
      }
      point_rep[p] = best_rank;
      point_dist[p] = best;
    }
  });

  // Per-model results and coverage.
  out.nearest.resize(n);
  out.distance.resize(n);
  Coverage& cov = out.coverage;
  cov.models = static_cast<int64_t>(n);
  cov.distinct_points = static_cast<int64_t>(u);
  cov.coarse_total = static_cast<int64_t>(im.coarse.size());
  cov.fine_total = static_cast<int64_t>(im.fine.size());
  std::vector<char> fine_has_rep(im.fine.size(), 0), coarse_has_rep(im.coarse.size(), 0);
  for (uint32_t c : centers) {
    fine_has_rep[im.fine_of[c]] = 1;
    coarse_has_rep[im.keys[c].coarse] = 1;
  }
  cov.coarse_covered = std::count(coarse_has_rep.begin(), coarse_has_rep.end(), 1);
  cov.fine_covered = std::count(fine_has_rep.begin(), fine_has_rep.end(), 1);
  double sum_distance = 0;
  for (size_t m = 0; m < n; ++m) {
    const uint32_t p = im.point_of[m];
    out.nearest[m] = point_rep[p];
    out.distance[m] = static_cast<float>(point_dist[p]);
    Representative& rep = out.representatives[point_rep[p]];
    ++rep.stands_for;
    rep.downloads_represented += im.downloads[m];
    cov.downloads_total += im.downloads[m];
    if (fine_has_rep[im.fine_of[p]]) cov.downloads_equivalent += im.downloads[m];
    sum_distance += point_dist[p];
    cov.max_distance = std::max(cov.max_distance, point_dist[p]);
  }
  cov.mean_distance = sum_distance / static_cast<double>(n);
  return out;
}

std::vector<size_t> PlainFarthestPoint(const Population& population, int k) {
  const Population::Impl& im = population.impl();
  const size_t n = im.downloads.size();
  std::vector<size_t> chosen;
  if (n == 0 || k < 1) return chosen;
  const std::vector<float> x = im.Normalised();
  std::vector<double> mind(n, std::numeric_limits<double>::infinity());
  size_t next = static_cast<size_t>(
      std::max_element(im.downloads.begin(), im.downloads.end()) - im.downloads.begin());
  struct Far {
    double dist;
    size_t model;
  };
  while (chosen.size() < static_cast<size_t>(k)) {
    chosen.push_back(next);
    const uint32_t c = im.point_of[next];
    const Far far = tbb::parallel_reduce(
        tbb::blocked_range<size_t>(0, n, 4096), Far{-1, 0},
        [&](const tbb::blocked_range<size_t>& r, Far acc) {
          for (size_t m = r.begin(); m < r.end(); ++m) {
            mind[m] = std::min(mind[m], PointDistance(im, x, im.point_of[m], c));
            if (mind[m] > acc.dist) acc = {mind[m], m};
          }
          return acc;
        },
        [](Far a, Far b) { return b.dist > a.dist || (b.dist == a.dist && b.model < a.model) ? b : a; });
    if (far.dist <= 0) break;
    next = far.model;
  }
  return chosen;
}

}  // namespace coverage::selection

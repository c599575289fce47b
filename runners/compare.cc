#include "runners/compare.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace coverage::runners {

// Note [Tolerances]
// ~~~~~~~~~~~~~~~~~
// An output passes when either
//  (a) every finite element satisfies |backend - ref| <= atol + rtol * |ref|,
//      with (rtol, atol) from the dtype's row of torch.testing.assert_close's
//      table (configs/tolerances.json can override per dtype and per op), or
//  (b) an fp64 golden exists and the backend's max error against it is at
//      most `multiplier` times the CPU reference's own max error against it
//      (2x by default, 3x for 16-bit types). This accepts a backend that
//      rounds differently from the CPU but no worse, e.g. a different
//      accumulation order in a long reduction.
// Non-finite values must match the reference position by position (NaN with
// NaN, +Inf with +Inf); a difference is its own outcome. Integer and bool
// outputs must be exact. Reported metrics are against the reference; the
// error ratio is against the golden.

namespace {

at::Tensor AsDoubleCpu(const at::Tensor& t) {
  at::Tensor c = t.device().is_cpu() ? t : t.cpu();
  if (c.is_complex()) c = at::view_as_real(c.resolve_conj());
  return c.to(at::kDouble).contiguous();
}

}  // namespace

TensorComparison CompareTensors(const at::Tensor& backend, const at::Tensor& reference, const at::Tensor& golden,
                                Tolerance tol, double multiplier, bool values_meaningful) {
  TensorComparison r;
  if (backend.sizes() != reference.sizes()) {
    r.outcome = Outcome::kShapeMismatch;
    r.message = fmt::format("shape {} != reference {}", c10::str(backend.sizes()), c10::str(reference.sizes()));
    r.values_compared = false;
    return r;
  }
  if (backend.scalar_type() != reference.scalar_type()) {
    r.outcome = Outcome::kDtypeMismatch;
    r.message = fmt::format("dtype {} != reference {}", c10::toString(backend.scalar_type()),
                            c10::toString(reference.scalar_type()));
    r.values_compared = false;
    return r;
  }
  if (!values_meaningful) {
    r.values_compared = false;
    return r;
  }
  const at::Tensor b = AsDoubleCpu(backend);
  const at::Tensor ref = AsDoubleCpu(reference);
  at::Tensor g;
  if (golden.defined() && golden.scalar_type() == at::kDouble && golden.sizes() == reference.sizes()) {
    g = golden.contiguous();
  } else if (golden.defined() && golden.scalar_type() == at::kComplexDouble && golden.sizes() == reference.sizes()) {
    g = at::view_as_real(golden.resolve_conj()).contiguous();
  }
  const double* bp = b.data_ptr<double>();
  const double* rp = ref.data_ptr<double>();
  const double* gp = g.defined() ? g.data_ptr<double>() : nullptr;
  const int64_t n = b.numel();
  const double inf = std::numeric_limits<double>::infinity();

  double max_abs = 0, max_rel = 0, dot = 0, nb = 0, nr = 0, backend_err = 0, ref_err = 0;
  int64_t mismatched = 0, nonfinite = 0;
  int64_t first_bad = -1;
  // One fused pass over the data (see bench/README.md for why it matters).
  for (int64_t i = 0; i < n; ++i) {
    const double bv = bp[i], rv = rp[i];
    if (!std::isfinite(bv) || !std::isfinite(rv)) {
      const bool same = (std::isnan(bv) && std::isnan(rv)) || (std::isinf(bv) && std::isinf(rv) && (bv > 0) == (rv > 0));
      if (!same) {
        ++nonfinite;
        if (first_bad < 0) first_bad = i;
      }
      continue;
    }
    const double diff = std::fabs(bv - rv);
    const double mag = std::fabs(rv);
    if (diff > max_abs) max_abs = diff;
    const double rel = mag > 0 ? diff / mag : (diff > 0 ? inf : 0.0);
    if (rel > max_rel) max_rel = rel;
    if (diff > tol.atol + tol.rtol * mag) {
      ++mismatched;
      if (first_bad < 0) first_bad = i;
    }
    dot += bv * rv;
    nb += bv * bv;
    nr += rv * rv;
    if (gp) {
      const double gv = gp[i];
      if (std::isfinite(gv)) {
        backend_err = std::max(backend_err, std::fabs(bv - gv));
        ref_err = std::max(ref_err, std::fabs(rv - gv));
      }
    }
  }
  r.elements = n;
  r.mismatched = mismatched;
  r.nonfinite_diff = nonfinite;
  r.max_abs_err = max_abs;
  r.max_rel_err = max_rel;
  r.cosine = (nb == 0 && nr == 0) ? 1.0 : (nb == 0 || nr == 0) ? 0.0 : dot / std::sqrt(nb * nr);
  if (gp) r.error_ratio = ref_err > 0 ? backend_err / ref_err : (backend_err > 0 ? inf : 1.0);

  if (nonfinite > 0) {
    r.outcome = Outcome::kNonFiniteMismatch;
    r.message = fmt::format("{} of {} elements differ in NaN/Inf from the reference (first at flat index {}: {} vs {})",
                            nonfinite, n, first_bad, bp[first_bad], rp[first_bad]);
    return r;
  }
  if (mismatched == 0) return r;
  if (r.error_ratio && *r.error_ratio <= multiplier) return r;  // rule (b)
  r.outcome = Outcome::kMismatch;
  r.message = fmt::format(
      "{} of {} elements outside rtol={:g} atol={:g} (max abs {:.3g}, max rel {:.3g}; first at flat index {}: {} vs {})",
      mismatched, n, tol.rtol, tol.atol, max_abs, max_rel, first_bad, bp[first_bad], rp[first_bad]);
  if (r.error_ratio) r.message += fmt::format("; error vs fp64 golden is {:.3g}x the CPU's (limit {:g}x)", *r.error_ratio, multiplier);
  return r;
}

}  // namespace coverage::runners

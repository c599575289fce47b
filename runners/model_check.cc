#include "runners/model_check.h"

#include "core/json_double.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "runners/backend.h"
#include "runners/compare.h"
#include "runners/dtype_map.h"
#include "runners/model_builder_internal.h"
#include "runners/model_session.h"

namespace coverage::runners {

// Note [Model verdicts]
// ~~~~~~~~~~~~~~~~~~~~~
// module, model: the backend's output is judged like a unit-stage output
// (Note [Tolerances]: the dtype's assert_close tolerance, or at most the
// multiplier times the CPU's own error against an fp64 golden run of the same
// model, weights rounded to the profile's dtype first), and in addition
//   - the cosine similarity of the flattened outputs must reach min_cosine
//     (0.99): a backend can be "as inexact as the CPU" element-wise on a
//     handful of values and still have turned the output around;
//   - for language-model logits, the backend's top-1 token must be among
//     the reference's top-k (5) at min_topk_agreement (99%) of positions.
//     Random weights make near-ties common, so exact top-1 agreement
//     (reported) would fail correct backends.
// Per-check tolerance overrides use the op names "module::<kind>" and
// "model::forward" in configs/tolerances.json.
//
// train: N steps of forward, loss (cross-entropy against fixed random labels
// for logits, else MSE against a fixed random target), backward and AdamW,
// all on the backend. Judged per step: the loss, and every parameter's
// gradient norm, within a relative tolerance of the reference's; after the
// last step the parameters' distance from the reference's, relative to how
// far the reference's moved. Gradient norms carry the check: Adam's update
// is nearly invariant to a gradient's scale, so a wrong gradient can leave
// the parameters close while its norm is off. A parameter whose gradient norm
// is below a millionth of the step's total holds rounding noise only (a
// device whose ATen decompositions differ from the CPU's shows 1.7e-13
// against 2.4e-13): its difference is taken relative to that millionth.

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

Status RunOnce(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, ModelSession& session,
               DispatchRoute& route, uint64_t seed) {
  route.session = &session;
  session.route = &route;
  return builder::RunInSession(f, plan, profile, session, seed);
}

void Fail(ModelCheckItem& item, Outcome outcome, const std::string& why) {
  if (item.outcome == Outcome::kPass) item.outcome = outcome;
  item.error += (item.error.empty() ? "" : "; ") + why;
}

void BackendFailed(ModelCheckItem& item, const Status& status) {
  const std::string msg = FirstLine(status.message());
  Fail(item, LooksUnsupported(msg) ? Outcome::kUnsupported : Outcome::kError, msg);
}

void ReferenceFailed(ModelCheckItem& item, const Status& status) {
  item.outcome = Outcome::kSkipped;
  item.error = "the CPU reference cannot run this model: " + FirstLine(status.message());
}

nlohmann::json OpCounts(const DispatchRoute& route) {
  nlohmann::json ops = nlohmann::json::object();
  for (const auto& [op, n] : route.op_counts) ops[op] = n;
  return ops;
}

DType DTypeOf(const at::Tensor& t) {
  auto d = ToDType(t.scalar_type());
  return d ? *d : DType::kFloat32;
}

// Judges `backend` against `reference` (and `golden`, when defined).
void Judge(ModelCheckItem& item, const at::Tensor& backend, const at::Tensor& reference, const at::Tensor& golden,
           const std::string& check, const ModelCheckOptions& options) {
  const DType dtype = DTypeOf(reference);
  const auto sep = check.find("::");
  const std::string op = check.substr(0, sep), overload = check.substr(sep + 2);
  const TensorComparison c = CompareTensors(backend, reference, golden, options.comparison.For(op, overload, dtype),
                                            options.comparison.MultiplierFor(op, overload, dtype), true);
  item.outcome = Outcome::kPass;
  item.error.clear();
  item.max_abs_err = c.max_abs_err;
  item.max_rel_err = c.max_rel_err;
  item.cosine = c.cosine;
  item.error_ratio = c.error_ratio;
  item.values_compared = c.values_compared;
  item.detail["elements"] = c.elements;
  item.detail["mismatched"] = c.mismatched;
  if (c.outcome != Outcome::kPass) Fail(item, c.outcome, c.message);
  if (c.values_compared && c.outcome != Outcome::kShapeMismatch && c.outcome != Outcome::kDtypeMismatch &&
      c.cosine < options.min_cosine) {
    Fail(item, Outcome::kMismatch, fmt::format("cosine similarity {:.6f} below {}", c.cosine, options.min_cosine));
  }
}

bool NeedsGolden(const ModelCheckItem& item, const ModelCheckOptions& options) {
  if (options.golden == GoldenMode::kAlways) return true;
  return options.golden == GoldenMode::kWhenNeeded && item.outcome == Outcome::kMismatch;
}

CaptureProfile GoldenProfile(const CaptureProfile& profile) {
  CaptureProfile g = profile;
  g.dtype = DType::kFloat64;
  return g;
}

void TopK(ModelCheckItem& item, const at::Tensor& backend, const at::Tensor& reference,
          const ModelCheckOptions& options) {
  const int64_t V = reference.size(-1);
  const at::Tensor r = reference.reshape({-1, V}).to(at::kFloat);
  const at::Tensor b = backend.to(c10::kCPU).reshape({-1, V}).to(at::kFloat);
  const int64_t k = std::min<int64_t>(std::max<int64_t>(1, options.top_k), V);
  const at::Tensor ref_top = std::get<1>(r.topk(k, -1));
  const at::Tensor top1 = b.argmax(-1, /*keepdim=*/true);
  const double agreement = (ref_top == top1).any(-1).to(at::kDouble).mean().item<double>();
  const double exact = (r.argmax(-1) == b.argmax(-1)).to(at::kDouble).mean().item<double>();
  item.detail["top_k"] = k;
  item.detail["topk_agreement"] = agreement;
  item.detail["top1_agreement"] = exact;
  if (agreement < options.min_topk_agreement) {
    Fail(item, Outcome::kMismatch,
         fmt::format("the backend's top-1 token is in the reference's top-{} at {:.1f}% of positions (needs {:.1f}%)",
                     k, 100 * agreement, 100 * options.min_topk_agreement));
  }
}

}  // namespace

std::vector<ModelCheckItem> CheckModules(const selection::Features& f, const BuildPlan& plan,
                                         const CaptureProfile& profile, Backend& backend,
                                         const ModelCheckOptions& options) {
  std::vector<ModelCheckItem> items;
  auto first_of_each_kind = [](std::set<std::string>& seen, const ModelSession& session) {
    return [&seen, &session](const std::string& path) {
      const std::string kind = session.KindOf(path);
      return kind != "other" && seen.insert(kind).second;
    };
  };
  const auto start = Clock::now();
  std::set<std::string> seen;
  ModelSession ref;
  DispatchRoute ref_route;
  ref.watch = first_of_each_kind(seen, ref);
  if (Status s = RunOnce(f, plan, profile, ref, ref_route, options.seed); !s.ok()) {
    ModelCheckItem item;
    item.item = "reference";
    ReferenceFailed(item, s);
    item.seconds = Since(start);
    return {item};
  }
  const double reference_seconds = Since(start);

  std::optional<std::map<std::string, at::Tensor>> golden;  // by module path, made when first needed
  auto golden_of = [&](const std::string& path) -> at::Tensor {
    if (!golden) {
      golden.emplace();
      std::set<std::string> golden_seen;
      ModelSession g;
      DispatchRoute g_route;
      g.weight_rounding = ToScalarType(profile.dtype);
      g.watch = first_of_each_kind(golden_seen, g);
      if (RunOnce(f, plan, GoldenProfile(profile), g, g_route, options.seed).ok()) {
        for (const auto& [p, t] : g.watched()) (*golden)[p] = t;
      }
    }
    auto it = golden->find(path);
    return it == golden->end() ? at::Tensor() : it->second;
  };

  for (const auto& [path, ref_out] : ref.watched()) {
    const auto t0 = Clock::now();
    ModelCheckItem item;
    item.item = ref.KindOf(path);
    item.detail["module"] = path;
    ModelSession s;
    DispatchRoute route;
    route.backend = &backend;
    route.routed = [p = path](const std::string& m) { return m == p || m.rfind(p + ".", 0) == 0; };
    s.watch = [p = path](const std::string& m) { return m == p; };
    s.stop_when_watched = true;
    const Status st = RunOnce(f, plan, profile, s, route, options.seed);
    item.detail["routed_ops"] = route.routed_ops;
    item.detail["ops"] = OpCounts(route);
    if (!st.ok()) {
      BackendFailed(item, st);
    } else if (s.watched().empty() || route.routed_ops == 0) {
      Fail(item, Outcome::kError, "module " + path + " ran no op on the backend");
    } else {
      const at::Tensor& out = s.watched().front().second;
      const std::string check = "module::" + item.item;
      Judge(item, out, ref_out, at::Tensor(), check, options);
      if (NeedsGolden(item, options)) {
        if (at::Tensor g = golden_of(path); g.defined()) Judge(item, out, ref_out, g, check, options);
      }
    }
    item.seconds = Since(t0) + reference_seconds / double(std::max<size_t>(1, ref.watched().size()));
    items.push_back(std::move(item));
  }
  return items;
}

ModelCheckItem CheckForward(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                            Backend& backend, const ModelCheckOptions& options) {
  const auto start = Clock::now();
  ModelCheckItem item;
  item.item = "forward";
  ModelSession ref;
  DispatchRoute ref_route;
  if (Status s = RunOnce(f, plan, profile, ref, ref_route, options.seed); !s.ok()) {
    ReferenceFailed(item, s);
    item.seconds = Since(start);
    return item;
  }
  ModelSession s;
  DispatchRoute route;
  route.backend = &backend;
  s.device = backend.device();
  const Status st = RunOnce(f, plan, profile, s, route, options.seed);
  item.detail["routed_ops"] = route.routed_ops;
  item.detail["ops"] = OpCounts(route);
  if (!st.ok()) {
    BackendFailed(item, st);
  } else if (!s.output().defined() || !ref.output().defined()) {
    Fail(item, Outcome::kError, "the model produced no output");
  } else if (route.routed_ops == 0) {
    Fail(item, Outcome::kError, "no op of the model ran on the backend");
  } else {
    const at::Tensor out = s.output().detach().to(c10::kCPU);
    const at::Tensor expected = ref.output().detach();
    item.detail["output_shape"] = expected.sizes().vec();
    Judge(item, out, expected, at::Tensor(), "model::forward", options);
    if (NeedsGolden(item, options)) {
      ModelSession g;
      DispatchRoute g_route;
      g.weight_rounding = ToScalarType(profile.dtype);
      if (RunOnce(f, plan, GoldenProfile(profile), g, g_route, options.seed).ok() && g.output().defined()) {
        Judge(item, out, expected, g.output().detach(), "model::forward", options);
      }
    }
    if (builder::IsLogits(f, expected) && out.sizes() == expected.sizes()) TopK(item, out, expected, options);
  }
  item.seconds = Since(start);
  return item;
}

namespace {

struct TrainTrace {
  Status status = Status::Ok();
  bool reference_failed = false;
  std::vector<double> losses;
  std::vector<std::vector<double>> grad_norms;  // [step][weight]
  std::vector<at::Tensor> initial, final_weights;
  std::vector<std::vector<int64_t>> shapes;
  int64_t routed_ops = 0;
  nlohmann::json ops = nlohmann::json::object();
};

TrainTrace Train(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile, Backend* backend,
                 const ModelCheckOptions& options) {
  TrainTrace trace;
  ModelSession s;
  s.training = true;
  if (backend) s.device = backend->device();
  DispatchRoute route;
  route.backend = backend;
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  builder::TrainingTarget target;
  for (int step = 0; step < options.train_steps; ++step) {
    if (Status st = RunOnce(f, plan, profile, s, route, options.seed); !st.ok()) {
      trace.status = st;
      return trace;
    }
    const std::vector<at::Tensor>& weights = s.weights();
    if (step == 0) {
      for (const at::Tensor& w : weights) {
        trace.initial.push_back(w.detach().to(c10::kCPU).clone());
        trace.shapes.push_back(w.sizes().vec());
      }
      // The fixed batch's targets, made on the CPU before anything is routed.
      const at::Tensor out = s.output();
      if (!out.defined()) {
        trace.status = Status::Internal("the model produced no output");
        return trace;
      }
      target = builder::MakeTrainingTarget(f, out, options.seed);
    }
    try {
      DispatchRouteScope scope(&route);
      const at::Tensor loss = builder::TrainingLoss(s.output(), target);
      loss.backward();
      trace.losses.push_back(loss.item<double>());
      at::NoGradGuard no_grad;
      // torch.optim.AdamW (single tensor, no amsgrad), step = step + 1.
      const double t = step + 1;
      const double bias1 = 1 - std::pow(options.beta1, t), bias2 = 1 - std::pow(options.beta2, t);
      if (exp_avg.empty()) {
        for (const at::Tensor& w : weights) {
          exp_avg.push_back(at::zeros_like(w));
          exp_avg_sq.push_back(at::zeros_like(w));
        }
      }
      for (size_t i = 0; i < weights.size(); ++i) {
        at::Tensor w = weights[i];
        const at::Tensor& g = w.grad();
        if (!g.defined()) continue;
        w.mul_(1 - options.learning_rate * options.weight_decay);
        exp_avg[i].mul_(options.beta1).add_(g, 1 - options.beta1);
        exp_avg_sq[i].mul_(options.beta2).addcmul_(g, g, 1 - options.beta2);
        const at::Tensor denom = (exp_avg_sq[i].sqrt() / std::sqrt(bias2)).add_(options.eps);
        w.addcdiv_(exp_avg[i], denom, -options.learning_rate / bias1);
      }
    } catch (const std::exception& e) {
      trace.status = Status::Internal(FirstLine(e.what()));
      return trace;
    }
    std::vector<double> norms;
    for (const at::Tensor& w : weights) {
      const at::Tensor& g = w.grad();
      norms.push_back(g.defined() ? g.detach().to(c10::kCPU).to(at::kDouble).norm().item<double>() : 0.0);
      if (g.defined()) const_cast<at::Tensor&>(w).mutable_grad() = at::Tensor();
    }
    trace.grad_norms.push_back(std::move(norms));
  }
  for (const at::Tensor& w : s.weights()) trace.final_weights.push_back(w.detach().to(c10::kCPU).clone());
  trace.routed_ops = route.routed_ops;
  trace.ops = OpCounts(route);
  return trace;
}

double Relative(double backend, double reference) {
  return std::abs(backend - reference) / std::max(std::abs(reference), 1e-12);
}

}  // namespace

namespace {

// How far one training trace is from another (`ref`).
struct TrainDiff {
  double loss_rel = 0;  // worst relative loss difference over the steps (finite losses)
  int64_t loss_step = -1;
  int64_t nonfinite_loss_step = -1;  // first step whose loss is finite in one trace only
  double grad_rel = 0;               // worst relative gradient-norm difference
  bool grad_finite = true;           // the other trace's norm at the worst weight is finite
  nlohmann::json worst_at = nullptr;
  nlohmann::json total_ref = nlohmann::json::array(), total_got = nlohmann::json::array();
  double param_rel = 0;  // ||p_got - p_ref|| / ||p_ref - p_initial||
  double max_abs = 0, cosine = 1;
};

// Gradient norms below this share of the step's total gradient norm are
// compared against that share (see DiffTraces).
constexpr double kGradNormFloor = 1e-6;

TrainDiff DiffTraces(const TrainTrace& ref, const TrainTrace& got) {
  TrainDiff d;
  for (size_t i = 0; i < ref.losses.size() && i < got.losses.size(); ++i) {
    const double r = ref.losses[i], b = got.losses[i];
    if (std::isfinite(r) != std::isfinite(b)) {
      if (d.nonfinite_loss_step < 0) d.nonfinite_loss_step = static_cast<int64_t>(i);
      continue;
    }
    if (std::isfinite(r) && Relative(b, r) > d.loss_rel) {
      d.loss_rel = Relative(b, r);
      d.loss_step = static_cast<int64_t>(i);
    }
  }
  for (size_t step = 0; step < ref.grad_norms.size() && step < got.grad_norms.size(); ++step) {
    double tr = 0, tg = 0;
    for (size_t w = 0; w < ref.grad_norms[step].size(); ++w) {
      tr += ref.grad_norms[step][w] * ref.grad_norms[step][w];
      tg += got.grad_norms[step][w] * got.grad_norms[step][w];
    }
    // A weight whose gradient is a vanishing share of the whole (1e-13
    // against a total of 1) holds rounding noise only; its difference is
    // judged against that share's floor, not its own size (Note [Model verdicts]).
    const double floor = std::isfinite(tr) ? std::max(kGradNormFloor * std::sqrt(tr), 1e-30) : 1e-30;
    for (size_t w = 0; w < ref.grad_norms[step].size(); ++w) {
      const double r = ref.grad_norms[step][w], b = got.grad_norms[step][w];
      const double rel = !std::isfinite(b) || !std::isfinite(r) ? (std::isfinite(b) == std::isfinite(r) ? 0 : INFINITY)
                                                                 : std::abs(b - r) / std::max(r, floor);
      if (rel > d.grad_rel) {
        d.grad_rel = rel;
        d.grad_finite = std::isfinite(b);
        d.worst_at = {{"step", step}, {"weight", w}, {"shape", ref.shapes[w]}, {"reference", r}, {"backend", b}};
      }
    }
    d.total_ref.push_back(std::sqrt(tr));
    d.total_got.push_back(std::sqrt(tg));
  }
  double diff2 = 0, update2 = 0, dot = 0, got2 = 0;
  for (size_t w = 0; w < ref.final_weights.size() && w < got.final_weights.size(); ++w) {
    const at::Tensor r = ref.final_weights[w].to(at::kDouble), b = got.final_weights[w].to(at::kDouble);
    const at::Tensor r_up = r - ref.initial[w].to(at::kDouble), b_up = b - got.initial[w].to(at::kDouble);
    diff2 += (b - r).pow(2).sum().item<double>();
    update2 += r_up.pow(2).sum().item<double>();
    got2 += b_up.pow(2).sum().item<double>();
    dot += (r_up * b_up).sum().item<double>();
    d.max_abs = std::max(d.max_abs, (b - r).abs().max().item<double>());
  }
  d.param_rel = update2 > 0 ? std::sqrt(diff2 / update2) : (diff2 > 0 ? INFINITY : 0.0);
  d.cosine = update2 > 0 && got2 > 0 ? dot / std::sqrt(update2 * got2) : 1.0;
  return d;
}

struct TrainTolerance {
  double loss, grad, param;
};

void JudgeTraining(ModelCheckItem& item, const TrainTrace& ref, const TrainDiff& d, const TrainTolerance& tol,
                   int steps) {
  item.outcome = Outcome::kPass;
  item.error.clear();
  if (d.nonfinite_loss_step >= 0) {
    const size_t i = static_cast<size_t>(d.nonfinite_loss_step);
    Fail(item, Outcome::kNonFiniteMismatch,
         fmt::format("step {}: loss is finite in one run only (reference {})", i, ref.losses[i]));
  }
  if (d.loss_rel > tol.loss) {
    Fail(item, Outcome::kMismatch,
         fmt::format("step {}: loss differs from the reference's {:.6g} by {:.3g} (relative; allowed {:.3g})",
                     d.loss_step, ref.losses[static_cast<size_t>(d.loss_step)], d.loss_rel, tol.loss));
  }
  if (d.grad_rel > tol.grad) {
    Fail(item, d.grad_finite ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
         fmt::format("gradient norm of weight {} {} at step {} is {:.6g}, reference {:.6g}",
                     d.worst_at["weight"].get<int64_t>(), d.worst_at["shape"].dump(), d.worst_at["step"].get<int64_t>(),
                     d.worst_at["backend"].get<double>(), d.worst_at["reference"].get<double>()));
  }
  if (!(d.param_rel <= tol.param)) {
    Fail(item, std::isfinite(d.param_rel) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
         fmt::format("parameters after {} steps differ from the reference's by {:.3g} of its update", steps,
                     d.param_rel));
  }
}

nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf"); }

}  // namespace

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
ModelCheckItem CheckTraining(const selection::Features& f, const BuildPlan& plan, const CaptureProfile& profile,
                             Backend& backend, const ModelCheckOptions& options) {
  const auto start = Clock::now();
  ModelCheckItem item;
  item.item = "train";
  const TrainTrace ref = Train(f, plan, profile, nullptr, options);
  if (!ref.status.ok()) {
    ReferenceFailed(item, ref.status);
    item.seconds = Since(start);
    return item;
  }
  const TrainTrace got = Train(f, plan, profile, &backend, options);
  item.detail["steps"] = options.train_steps;
  item.detail["weights"] = ref.initial.size();
  item.detail["routed_ops"] = got.routed_ops;
  item.detail["ops"] = got.ops;
  item.detail["losses_reference"] = ref.losses;
  item.detail["losses_backend"] = got.losses;
  if (!got.status.ok()) {
    BackendFailed(item, got.status);
    item.seconds = Since(start);
    return item;
  }
  if (got.routed_ops == 0) {
    Fail(item, Outcome::kError, "no op of the training steps ran on the backend");
    item.seconds = Since(start);
    return item;
  }
  item.values_compared = true;
  const bool narrow = profile.dtype == DType::kBFloat16 || profile.dtype == DType::kFloat16;
  const double scale = narrow ? 10.0 : 1.0;
  TrainTolerance tol{options.loss_rtol * scale, options.grad_norm_rtol * scale, options.param_update_rtol * scale};
  const TrainDiff d = DiffTraces(ref, got);
  item.detail["grad_norm_reference"] = d.total_ref;
  item.detail["grad_norm_backend"] = d.total_got;
  item.detail["worst_grad_norm_rel_err"] = Finite(d.grad_rel);
  item.detail["worst_grad"] = d.worst_at;
  item.detail["param_update_rel_diff"] = Finite(d.param_rel);
  item.max_abs_err = d.max_abs;
  item.max_rel_err = d.param_rel;
  item.cosine = d.cosine;
  JudgeTraining(item, ref, d, tol, options.train_steps);
  if (item.outcome == Outcome::kMismatch && options.golden != GoldenMode::kNever) {
    // See Note [Reproducible training].
    const TrainTrace again = Train(f, plan, profile, nullptr, options);
    if (again.status.ok()) {
      const TrainDiff self = DiffTraces(ref, again);
      const double k = options.comparison.default_multiplier;
      item.detail["reference_reproducibility"] = {
          {"loss_rel", Finite(self.loss_rel)}, {"grad_norm_rel", Finite(self.grad_rel)},
          {"param_update_rel", Finite(self.param_rel)}};
      if (self.loss_rel > 0 || self.grad_rel > 0 || self.param_rel > 0) {
        const bool unreproducible = self.loss_rel > tol.loss || self.grad_rel > tol.grad || self.param_rel > tol.param;
        tol = {std::max(tol.loss, k * self.loss_rel), std::max(tol.grad, k * self.grad_rel),
               std::max(tol.param, k * self.param_rel)};
        item.detail["tolerances_widened_to"] = {
            {"loss_rel", Finite(tol.loss)}, {"grad_norm_rel", Finite(tol.grad)}, {"param_update_rel", Finite(tol.param)}};
        const std::string strict = item.error;
        JudgeTraining(item, ref, d, tol, options.train_steps);
        if (item.outcome == Outcome::kMismatch && unreproducible) {
          // The reference disagrees with itself beyond the tolerances: no verdict at this precision.
          item.outcome = Outcome::kSkipped;
          item.error = fmt::format(
              "the CPU reference is not reproducible at these tolerances (two runs differ by loss {:.3g}, gradient "
              "norm {:.3g}, parameters {:.3g}, relative), so training of this model cannot be judged; against the "
              "first run: {}",
              self.loss_rel, self.grad_rel, self.param_rel, strict);
        }
      }
    }
  }
  item.seconds = Since(start);
  return item;
}

std::vector<ModelCheckItem> InProcessModelStageRunner::Run(const std::string& stage,
                                                           const selection::Features& features,
                                                           const nlohmann::json& /*config*/,
                                                           const CaptureProfile& profile, const BuildOptions& /*build*/,
                                                           const BuildPlan& plan) {
  if (stage == "module") return CheckModules(features, plan, profile, backend_, options_);
  if (stage == "model") return {CheckForward(features, plan, profile, backend_, options_)};
  return {CheckTraining(features, plan, profile, backend_, options_)};
}

nlohmann::json ModelCheckItemToJson(const ModelCheckItem& item) {
  nlohmann::json j = {{"item", item.item},
                      {"outcome", OutcomeName(item.outcome)},
                      {"error", item.error},
                      {"max_abs_err", DoubleToJson(item.max_abs_err)},
                      {"max_rel_err", DoubleToJson(item.max_rel_err)},
                      {"cosine", DoubleToJson(item.cosine)},
                      {"values_compared", item.values_compared},
                      {"detail", item.detail},
                      {"seconds", item.seconds}};
  if (item.error_ratio) j["error_ratio"] = DoubleToJson(*item.error_ratio);
  return j;
}

Result<ModelCheckItem> ModelCheckItemFromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("item") || !j.contains("outcome")) {
    return Status::Corruption("model check item: expected an object with 'item' and 'outcome'");
  }
  ModelCheckItem item;
  item.item = j["item"].get<std::string>();
  auto outcome = OutcomeFromName(j["outcome"].get<std::string>());
  if (!outcome) return Status::Corruption("model check item: unknown outcome " + j["outcome"].dump());
  item.outcome = *outcome;
  item.error = j.value("error", std::string());
  item.max_abs_err = DoubleFromJson(j.value("max_abs_err", nlohmann::json())).value_or(0.0);
  item.max_rel_err = DoubleFromJson(j.value("max_rel_err", nlohmann::json())).value_or(0.0);
  item.cosine = DoubleFromJson(j.value("cosine", nlohmann::json())).value_or(1.0);
  if (j.contains("error_ratio")) item.error_ratio = DoubleFromJson(j["error_ratio"]);
  item.values_compared = j.value("values_compared", false);
  item.detail = j.value("detail", nlohmann::json::object());
  item.seconds = j.value("seconds", 0.0);
  return item;
}

}  // namespace coverage::runners

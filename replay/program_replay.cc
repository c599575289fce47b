#include "replay/program_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <unordered_map>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/dtype_map.h"
#include "backends/host.h"
#include "replay/compare.h"
#include "replay/replay.h"
#include "replay/replayer.h"

namespace coverage::replay {
using backends::ToDType;
using backends::ToScalarType;
namespace {

using namespace programs;
using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Fail(ModelItemResult& item, Outcome outcome, const std::string& why) {
  if (item.outcome == Outcome::kPass) {
    item.outcome = outcome;
    item.error = why;
  }
}

bool LanguageModel(const Program& p) {
  static const std::set<std::string> kinds = {"decoder", "encoder-decoder", "hybrid", "ssm", "multimodal"};
  return kinds.count(p.info.kind) > 0;
}

// Judges the outputs (Note [Model verdicts]): each output against the
// reference (golden where given), the worst one reported.
void JudgeOutputs(ModelItemResult& item, const std::vector<Judged>& outputs,
                  const std::function<at::Tensor(int64_t)>& golden_of, const ProgramReplayOptions& options) {
  item.outcome = Outcome::kPass;
  item.error.clear();
  item.max_abs_err.reset();
  item.max_rel_err.reset();
  item.cosine.reset();
  item.error_ratio.reset();
  double max_abs = 0, max_rel = 0, cosine = 1;
  bool compared = false;
  int64_t elements = 0, mismatched = 0, by_products = 0;
  for (const auto& o : outputs) {
    if (o.by_product) {  // Note [By-products]
      ++by_products;
      continue;
    }
    const DType dt = ToDType(o.reference.scalar_type()).value_or(DType::kFloat32);
    const Tolerance tol = options.check.comparison.For("model", "forward", dt);
    const double mult = options.check.comparison.MultiplierFor("model", "forward", dt);
    const TensorComparison c = CompareTensors(o.backend, o.reference, golden_of(o.id), tol, mult, o.meaningful);
    if (!c.values_compared) continue;
    compared = true;
    elements += c.elements;
    mismatched += c.mismatched + c.nonfinite_diff;
    max_abs = std::max(max_abs, c.max_abs_err);
    max_rel = std::max(max_rel, c.max_rel_err);
    if (c.error_ratio) item.error_ratio = std::max(item.error_ratio.value_or(0.0), *c.error_ratio);
    const std::string where = fmt::format("output of call {} ({})", o.call, o.op);
    if (c.outcome != Outcome::kPass) Fail(item, c.outcome, where + ": " + c.message);
    // Cosine similarity judges direction where the values needed the ratio
    // rule; an output within the reference tolerance everywhere (a layer
    // norm's saved mean at rounding level) has nothing for it to judge.
    if (o.reference.is_floating_point() && o.reference.numel() > 1 && c.mismatched + c.nonfinite_diff > 0) {
      cosine = std::min(cosine, c.cosine);
      if (c.cosine < options.check.min_cosine && c.outcome != Outcome::kShapeMismatch &&
          c.outcome != Outcome::kDtypeMismatch) {
        Fail(item, Outcome::kMismatch,
             fmt::format("{}: cosine similarity {:.6f} below {}", where, c.cosine, options.check.min_cosine));
      }
    }
  }
  if (compared) {
    item.max_abs_err = max_abs;
    item.max_rel_err = max_rel;
    item.cosine = cosine;
  }
  item.detail["outputs"] = outputs.size() - by_products;
  if (by_products > 0) item.detail["by_products_not_judged"] = by_products;
  item.detail["elements"] = elements;
  item.detail["mismatched"] = mismatched;
}

// The main output's positions (rows of its last dimension), the reference's
// top-k values and whether the backend's top-1 token is among them. The
// logits stay in their own dtype (no float64 copy of a [tokens, vocab]
// tensor: Note [Memory estimate]); the few values compared are widened.
struct TopKView {
  int64_t k = 1;
  at::Tensor r, ref_values, top1, in_top;

  TopKView(const Judged& main, int64_t top_k) {
    const int64_t V = main.reference.size(-1);
    r = main.reference.reshape({-1, V});
    k = std::min<int64_t>(std::max<int64_t>(1, top_k), V);
    at::Tensor ref_top;
    std::tie(ref_values, ref_top) = r.topk(k, -1);
    ref_values = ref_values.to(at::kDouble);
    top1 = main.backend.reshape({-1, V}).argmax(-1, /*keepdim=*/true);
    in_top = (ref_top == top1).any(-1);
  }
  bool Strays() const { return !in_top.all().item<bool>(); }
};

// Note [Model verdicts], top-k: a position where the backend's top-1 token
// is outside the reference's top-k counts only when the reference ranks
// that token below its k-th by more than the logits may err (twice the
// element tolerance: the dtype's, or the multiplier times the CPU's own
// error against the golden in that row); closer than that, the two tokens
// are tied within tolerance and the backend's pick is as good as the
// reference's. Random weights make such ties common.
void TopK(ModelItemResult& item, const Judged& main, const TopKView& view, const at::Tensor& golden,
          const ProgramReplayOptions& options) {
  const at::Tensor& reference = main.reference;
  const at::Tensor& r = view.r;
  const int64_t k = view.k;
  const DType dt = ToDType(reference.scalar_type()).value_or(DType::kFloat32);
  const Tolerance tol = options.check.comparison.For("model", "forward", dt);
  // Per row: how far each logit may be off.
  at::Tensor allowed = at::maximum(r.amax(-1).abs(), r.amin(-1).abs()).to(at::kDouble) * tol.rtol + tol.atol;
  if (golden.defined() && golden.sizes() == reference.sizes()) {
    const double mult = options.check.comparison.MultiplierFor("model", "forward", dt);
    const at::Tensor g = golden.reshape(r.sizes());
    // The reference's error per row, a few rows at a time (one float64 copy
    // of the logits would be as large as the golden's).
    at::Tensor off = at::empty({r.size(0)}, g.options());
    const int64_t rows = std::max<int64_t>(1, (int64_t{1} << 23) / std::max<int64_t>(1, r.size(1)));
    for (int64_t at = 0; at < r.size(0); at += rows) {
      const int64_t n = std::min(rows, r.size(0) - at);
      off.narrow(0, at, n).copy_((r.narrow(0, at, n).to(at::kDouble) - g.narrow(0, at, n)).abs().amax(-1));
    }
    allowed = at::maximum(allowed, off * mult);
  }
  const at::Tensor& in_top = view.in_top;
  const at::Tensor gap =
      view.ref_values.select(-1, k - 1) - r.gather(-1, view.top1).squeeze(-1).to(at::kDouble);
  const at::Tensor tied = at::logical_and(in_top.logical_not(), gap <= allowed * 2);
  const double agreement = at::logical_or(in_top, tied).to(at::kDouble).mean().item<double>();
  item.detail["top_k"] = k;
  item.detail["topk_agreement"] = agreement;
  item.detail["topk_ties"] = tied.sum().item<int64_t>();
  item.detail["top1_agreement"] = (r.argmax(-1) == view.top1.squeeze(-1)).to(at::kDouble).mean().item<double>();
  if (agreement < options.check.min_topk_agreement) {
    Fail(item, Outcome::kMismatch,
         fmt::format("the backend's top-1 token is in the reference's top-{} (or tied with it within tolerance) at "
                     "{:.1f}% of positions (needs {:.1f}%)",
                     k, 100 * agreement, 100 * options.check.min_topk_agreement));
  }
}

void Stats(ModelItemResult& item, const Replayer& r, const Program& p) {
  item.detail["replay"] = {{"calls", p.calls.size()},
                           {"calls_run", r.calls_run()},
                           {"peak_live_bytes", r.peak_live_bytes()},
                           {"backend_seconds", r.backend_seconds()},
                           {"reference_seconds", r.reference_seconds()},
                           {"reference_upcasts", r.reference_upcasts()}};
  if (r.reference_rounded() > 0) {  // Note [Declared numerics]
    item.detail["replay"]["reference_rounded_operands"] = r.reference_rounded();
  }
}

// Judged outputs, golden asked for when they mismatch, or when `want` (the
// main output, for top-k) is given; `want`'s golden is returned.
at::Tensor JudgeWithGolden(ModelItemResult& item, const std::vector<Judged>& outputs,
                           const ProgramReplayOptions& options, const Program& program, const Judged* want) {
  JudgeOutputs(item, outputs, [](int64_t) { return at::Tensor(); }, options);
  const bool ask = options.check.golden == GoldenMode::kAlways ||
                   (options.check.golden == GoldenMode::kWhenNeeded && (item.outcome == Outcome::kMismatch || want));
  if (!ask) return {};
  std::set<int64_t> ids;
  for (const auto& o : outputs) ids.insert(o.id);
  Replayer golden(program, nullptr, options);
  Failure f = golden.Prepare();
  if (f.outcome == Outcome::kPass) {
    golden.WantGolden(ids);
    f = golden.Run(Mode::kGolden);
  }
  if (f.outcome != Outcome::kPass) {
    item.detail["golden_note"] = "the fp64 golden did not complete: " + f.message;
    return {};
  }
  JudgeOutputs(item, outputs, [&](int64_t id) { return golden.golden(id); }, options);
  item.detail["golden"] = true;
  return want ? golden.golden(want->id) : at::Tensor();
}

// The first divergent call of a failing item (one kLocate pass: every call
// on the backend fed the reference's inputs), or in words why none is named.
void Locate(ModelItemResult& item, const Program& program, Backend& backend, const ProgramReplayOptions& options,
            const char* accumulated) {
  if (!options.locate_first_divergent) return;
  Replayer locate(program, &backend, options);
  if (locate.Prepare().outcome != Outcome::kPass) return;
  const Failure f = locate.Run(Mode::kLocate);
  if (!locate.divergent().is_null()) {
    item.detail["first_divergent"] = locate.divergent();
  } else {
    item.detail["first_divergent_note"] = f.outcome == Outcome::kPass ? accumulated : "the search stopped: " + f.message;
  }
}

}  // namespace

ModelItemResult ReplayProgram(const Program& program, Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelItemResult item;
  item.item = "forward";
  try {
    // Gone before the search runs, with whatever a failed pass left alive
    // (Note [Memory estimate]: one replay's values at a time).
    std::optional<Replayer> replayer(std::in_place, program, &backend, options);
    Failure f = replayer->Prepare();
    if (f.outcome == Outcome::kPass) f = replayer->Run(Mode::kFree);
    Stats(item, *replayer, program);
    if (f.outcome != Outcome::kPass) {
      Fail(item, f.outcome, f.message);
      if (f.call >= 0) item.detail["failed_call"] = f.call;
    } else {
      const auto& outputs = replayer->judged();
      // The main output: the last floating one of the forward phase.
      const Judged* main = nullptr;
      for (const auto& o : outputs) {
        if (o.phase == "forward" && o.reference.is_floating_point() && o.meaningful && !o.by_product) main = &o;
      }
      const bool top_k = main && LanguageModel(program) && main->reference.dim() >= 2 &&
                         main->backend.sizes() == main->reference.sizes() && main->reference.size(-1) > 1;
      // Top-k needs the golden only where the backend's top-1 strays.
      const std::optional<TopKView> view = top_k ? std::optional<TopKView>(std::in_place, *main, options.check.top_k)
                                                 : std::nullopt;
      const at::Tensor main_golden =
          JudgeWithGolden(item, outputs, options, program, view && view->Strays() ? main : nullptr);
      if (main) {
        item.detail["output_shape"] = main->reference.sizes().vec();
        if (view) TopK(item, *main, *view, main_golden, options);
      }
    }
    replayer.reset();
    if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped) {
      Locate(item, program, backend, options, "every call is within its tolerance given the reference's inputs: the "
                                              "error accumulated over calls");
    }
  } catch (const std::exception& e) {
    const std::string what = "internal error in coverage while replaying the program: " + FirstLine(e.what(), 500);
    if (item.outcome == Outcome::kPass) {
      Fail(item, Outcome::kError, what);
    } else {
      item.detail["first_divergent_note"] = "the search stopped: " + what;  // the verdict above stands
    }
  }
  item.seconds = Since(start);
  return item;
}

namespace {

// The first wrong call of each failing module item: one locate pass that
// runs only the failing modules' calls on the backend, each fed the
// reference's inputs (Replayer::divergent_by_module), as the model stage
// locates the model's first divergent call.
void LocateInModules(const Program& program, Backend& backend, const ProgramReplayOptions& options,
                     std::vector<ModelItemResult>& items) {
  std::set<std::string> failing;
  for (const auto& item : items) {
    if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped) failing.insert(item.item);
  }
  if (failing.empty() || !options.locate_first_divergent) return;
  Replayer locate(program, &backend, options);
  Failure f;
  try {
    f = locate.Prepare();
    if (f.outcome == Outcome::kPass) f = locate.Run(Mode::kLocate, failing);
  } catch (const std::exception& e) {  // the verdicts stand; only the search stopped
    f = {Outcome::kError, "internal error in coverage: " + FirstLine(e.what(), 500)};
  }
  for (auto& item : items) {
    if (!failing.count(item.item)) continue;
    auto found = locate.divergent_by_module().find(item.item);
    if (found != locate.divergent_by_module().end()) {
      item.detail["first_divergent"] = found->second;
    } else if (f.outcome == Outcome::kPass) {
      item.detail["first_divergent_note"] =
          "every call of the module is within its tolerance given the reference's inputs: the error accumulated "
          "over its calls";
    } else {
      item.detail["first_divergent_note"] = "the search stopped: " + f.message;
    }
  }
}

}  // namespace

std::vector<ModelItemResult> ReplayModules(const Program& program, const std::vector<std::string>& modules,
                                           Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  std::vector<ModelItemResult> items(modules.size());
  for (size_t i = 0; i < modules.size(); ++i) {
    items[i].item = modules[i];
    items[i].detail["module"] = modules[i];
  }
  auto fail_all = [&](Outcome o, const std::string& why) {
    for (auto& item : items) Fail(item, o, why);
  };
  try {
    std::optional<Replayer> replayer(std::in_place, program, &backend, options);  // gone before the search
    Failure f = replayer->Prepare();
    // A failure inside a module (a call the backend cannot run, a shape it
    // changes) is that module's, and the pass runs again without it, so one
    // module's unsupported call does not hide the others' verdicts; any
    // other failure stops them all.
    std::set<std::string> running(modules.begin(), modules.end());
    while (f.outcome == Outcome::kPass && !running.empty()) {
      f = replayer->Run(Mode::kModule, running);
      if (f.outcome == Outcome::kPass) break;
      const ProgramCall* call = f.call >= 0 ? &program.calls[static_cast<size_t>(f.call)] : nullptr;
      auto it = call ? std::find(modules.begin(), modules.end(), call->module) : modules.end();
      if (it == modules.end() || !running.count(*it)) break;
      Fail(items[static_cast<size_t>(it - modules.begin())], f.outcome, f.message);
      running.erase(*it);
      f = {};
    }
    if (f.outcome != Outcome::kPass) {
      fail_all(f.outcome, f.message);
    } else {
      for (size_t i = 0; i < modules.size(); ++i) {
        if (!running.count(modules[i])) continue;  // failed inside, above
        ModelItemResult& item = items[i];
        std::vector<Judged> outputs;
        for (const auto& o : replayer->judged()) {
          if (o.module == modules[i]) outputs.push_back(o);
        }
        item.detail["calls"] = replayer->module_calls(modules[i]);
        item.detail["boundary_outputs"] = outputs.size();
        if (replayer->module_calls(modules[i]) == 0) {
          Fail(item, Outcome::kSkipped, "no call of the program ran in module '" + modules[i] + "'");
          continue;
        }
        if (outputs.empty()) {
          item.detail["note"] = "the module's values never leave it";
          continue;
        }
        JudgeWithGolden(item, outputs, options, program, nullptr);
      }
    }
    replayer.reset();
    LocateInModules(program, backend, options, items);
  } catch (const std::exception& e) {
    fail_all(Outcome::kError, "internal error in coverage while replaying the modules: " + FirstLine(e.what(), 500));
  }
  const double seconds = Since(start) / std::max<size_t>(1, modules.size());
  for (auto& item : items) item.seconds = seconds;
  return items;
}

ModelItemResult ReplayModule(const Program& program, const std::string& module, Backend& backend,
                             const ProgramReplayOptions& options) {
  return ReplayModules(program, {module}, backend, options).front();
}

namespace {

// One run of the step program N times, parameters carried over: on the
// backend against the reference, or (backend null) the fp64 golden alone.
struct TrainTrace {
  std::vector<double> ref_loss, dev_loss;                 // per step
  std::vector<std::vector<double>> ref_grads, dev_grads;  // per step, per gradient
  std::vector<Replayer::ParameterState> params;           // after the last step
  int64_t peak_live_bytes = 0;                            // both sides' tensors at most (Replayer)
};

struct TrainRun {
  Failure failure;
  TrainTrace trace;
};

TrainRun Train(const Program& program, Backend* backend, const ProgramReplayOptions& options, int steps) {
  Replayer r(program, backend, options);
  if (Failure f = r.Prepare(); f.outcome != Outcome::kPass) return {f, {}};
  r.CarryParameters(/*keep_initial=*/backend != nullptr);
  TrainTrace t;
  for (int step = 0; step < steps; ++step) {
    Failure f = r.Run(backend ? Mode::kFree : Mode::kGolden);
    if (f.outcome != Outcome::kPass) {
      f.message = fmt::format("step {}: {}", step, f.message);
      return {f, {}};
    }
    const StepRecord& s = r.step();
    t.ref_loss.push_back(s.ref_loss);
    t.dev_loss.push_back(s.dev_loss);
    t.ref_grads.push_back(s.ref_grad_norms);
    t.dev_grads.push_back(s.dev_grad_norms);
  }
  t.params = r.Parameters();
  t.peak_live_bytes = r.peak_live_bytes();
  return {{}, std::move(t)};
}

double Relative(double value, double truth, double floor) {
  if (!std::isfinite(value) || !std::isfinite(truth)) return std::isfinite(value) == std::isfinite(truth) ? 0 : INFINITY;
  return std::abs(value - truth) / std::max(std::abs(truth), floor);
}

// How far `value` is from `truth` (Note [Training verdicts]), and where.
struct Off {
  double err = 0;
  size_t at = 0;  // the worst gradient
};

// The gradient norms of one step as one vector: ||value - truth|| over
// ||truth||, and the gradient that differs most. Weighted by their size:
// a gradient at rounding level (a device whose ATen decompositions differ
// from the CPU's shows 1.7e-13 against 2.4e-13) or one whose relative
// error is an extreme draw among hundreds weighs as little as it matters
// to the step.
Off GradsOff(const std::vector<double>& value, const std::vector<double>& truth) {
  if (value.size() != truth.size()) return {INFINITY, 0};
  double diff2 = 0, total2 = 0, worst = -1;
  Off off;
  for (size_t w = 0; w < value.size(); ++w) {
    const double d = value[w] - truth[w];
    if (!std::isfinite(d)) return {INFINITY, w};
    diff2 += d * d;
    total2 += truth[w] * truth[w];
    if (std::abs(d) > worst) {
      worst = std::abs(d);
      off.at = w;
    }
  }
  off.err = total2 > 0 ? std::sqrt(diff2 / total2) : (diff2 > 0 ? INFINITY : 0);
  return off;
}

// ||value - truth|| over ||truth - initial||: the parameters' distance
// relative to how far training moved them. `side` picks the reference's
// (false) or the backend's (true) parameters of `value`, whose initial
// values are the truth's too (the golden keeps none of its own).
double ParamsOff(const std::vector<Replayer::ParameterState>& value, bool side,
                 const std::vector<Replayer::ParameterState>& truth) {
  double diff2 = 0, update2 = 0;
  for (size_t i = 0; i < value.size() && i < truth.size(); ++i) {
    const at::Tensor& v = side ? value[i].dev : value[i].ref;
    if (!v.defined() || !value[i].initial.defined()) return INFINITY;
    const at::Tensor t = truth[i].ref.to(at::kDouble);
    const double diff = (v.to(at::kDouble) - t).norm().item<double>();
    const double update = (t - value[i].initial.to(at::kDouble)).norm().item<double>();
    if (!std::isfinite(diff)) return INFINITY;
    diff2 += diff * diff;
    update2 += update * update;
  }
  if (value.size() != truth.size()) return INFINITY;
  return update2 > 0 ? std::sqrt(diff2 / update2) : (diff2 > 0 ? INFINITY : 0);
}

nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf"); }

nlohmann::json FiniteList(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(Finite(v));
  return out;
}

// One judged quantity of the step (Note [Training verdicts]).
struct TrainCheck {
  std::string what;   // "step 1: the loss", "step 0: the gradient norms (...)", "the parameters after 3 steps"
  double backend = 0;  // the backend's difference (from the reference, or from the golden)
  double cpu = 0;      // the reference's from the golden (golden verdicts only)
};

// The backend's step quantities of `t` against `truth`'s reference side (t
// itself, or the fp64 golden), in the order the step computes them; against
// the golden, also the reference's own, each quantity over the whole run as
// one tensor: the reference's largest over the steps (Note [Training
// verdicts]: a single step's loss error is one random draw, and the CPU's can
// be near zero by chance).
struct TrainComparison {
  std::vector<TrainCheck> checks;
  std::vector<double> loss_err, cpu_loss_err, grad_err, cpu_grad_err;
  double param_err = 0, cpu_param_err = 0;
};

// The largest of `values` (0 for none); an infinity wins.
double Largest(const std::vector<double>& values) {
  double out = 0;
  for (double v : values) out = std::max(out, v);
  return out;
}

TrainComparison Compare(const TrainTrace& t, const TrainTrace& truth, int steps) {
  const bool golden = &truth != &t;
  TrainComparison c;
  std::vector<size_t> worst;
  for (size_t s = 0; s < t.ref_loss.size() && s < truth.ref_loss.size(); ++s) {
    const Off g = GradsOff(t.dev_grads[s], truth.ref_grads[s]);
    c.loss_err.push_back(Relative(t.dev_loss[s], truth.ref_loss[s], 1e-30));
    c.grad_err.push_back(g.err);
    worst.push_back(g.at);
    c.cpu_loss_err.push_back(golden ? Relative(t.ref_loss[s], truth.ref_loss[s], 1e-30) : 0.0);
    c.cpu_grad_err.push_back(golden ? GradsOff(t.ref_grads[s], truth.ref_grads[s]).err : 0.0);
  }
  const double loss_cpu = Largest(c.cpu_loss_err), grad_cpu = Largest(c.cpu_grad_err);
  for (size_t s = 0; s < c.loss_err.size(); ++s) {
    c.checks.push_back({fmt::format("step {}: the loss", s), c.loss_err[s], loss_cpu});
    c.checks.push_back({fmt::format("step {}: the gradient norms (most off: gradient {})", s, worst[s]), c.grad_err[s],
                        grad_cpu});
  }
  c.param_err = ParamsOff(t.params, true, truth.params);
  c.cpu_param_err = golden ? ParamsOff(t.params, false, truth.params) : 0.0;
  c.checks.push_back({fmt::format("the parameters after {} steps", steps), c.param_err, c.cpu_param_err});
  return c;
}

}  // namespace

ModelItemResult ReplayTraining(const Program& program, Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelItemResult item;
  item.item = "train";
  const int steps = std::max(1, options.check.train_steps);
  item.detail["steps"] = steps;
  try {
    bool has_optimizer = false;
    for (const auto& c : program.calls) has_optimizer = has_optimizer || c.phase == "optimizer";
    if (!has_optimizer) {
      Fail(item, Outcome::kSkipped, "the program has no optimizer step (capture it with a training profile)");
      item.seconds = Since(start);
      return item;
    }
    const TrainRun run = Train(program, &backend, options, steps);
    if (run.failure.outcome != Outcome::kPass) {
      Fail(item, run.failure.outcome, run.failure.message);
      if (run.failure.call >= 0) item.detail["failed_call"] = run.failure.call;
    } else {
      const TrainTrace& t = run.trace;
      item.detail["replay"] = {{"peak_live_bytes", t.peak_live_bytes}};
      DType dt = DType::kFloat32;
      for (const auto& v : program.values) {
        if (v.kind == "parameter" && v.tensor && IsFloatingDType(v.tensor->dtype)) {
          dt = v.tensor->dtype;
          break;
        }
      }
      const double rtol = options.check.comparison.For("train", "step", dt).rtol;
      // A backend that declares narrower matmul operands trains with their
      // noise: the multiplier of that precision's dtype (bf16; TF32 has
      // f16's mantissa), Note [Training verdicts].
      const auto& declared = options.check.comparison.numerics;
      const DType noise = dt != DType::kFloat32 || declared.empty() ? dt
                          : declared.fp32_operands == DeclaredNumerics::Rounding::kBf16 ? DType::kBFloat16
                                                                                       : DType::kFloat16;
      const double mult = std::max(options.check.comparison.MultiplierFor("train", "step", dt),
                                   options.check.comparison.MultiplierFor("train", "step", noise));
      // The backend against the reference, in the order the step computes.
      const TrainComparison to_reference = Compare(t, t, steps);
      const std::vector<TrainCheck>& checks = to_reference.checks;
      const double loss_rel = Largest(to_reference.loss_err), grad_rel = Largest(to_reference.grad_err);
      const double param_rel = to_reference.param_err;
      item.detail["losses"] = FiniteList(t.dev_loss);
      item.detail["reference_losses"] = FiniteList(t.ref_loss);
      item.detail["loss_rel"] = Finite(loss_rel);
      item.detail["grad_norm_rel"] = Finite(grad_rel);
      item.detail["param_update_rel"] = Finite(param_rel);
      item.max_abs_err = 0;  // relative figures only (the details hold each)
      item.max_rel_err = std::max({loss_rel, grad_rel, param_rel});
      item.cosine = 1;
      item.outcome = Outcome::kPass;
      const TrainCheck* miss = nullptr;
      for (const auto& c : checks) {
        if (!(c.backend <= rtol)) {
          miss = &c;
          break;
        }
      }
      if (miss && options.check.golden == GoldenMode::kNever) {
        Fail(item, std::isfinite(miss->backend) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
             fmt::format("{} differs from the reference's by {:.3g} (relative; allowed {:.3g}, no fp64 golden)",
                         miss->what, miss->backend, rtol));
      } else if (miss || options.check.golden == GoldenMode::kAlways) {
        const TrainRun golden = Train(program, nullptr, options, steps);
        if (golden.failure.outcome != Outcome::kPass) {
          Fail(item, Outcome::kMismatch,
               fmt::format("{} differs from the reference's by {:.3g} (relative; allowed {:.3g}), and the fp64 "
                           "golden did not complete: {}",
                           miss ? miss->what : "nothing", miss ? miss->backend : 0.0, rtol, golden.failure.message));
        } else {
          const TrainTrace& g = golden.trace;
          const TrainComparison to_golden = Compare(t, g, steps);
          const std::vector<TrainCheck>& against = to_golden.checks;
          item.detail["golden"] = {{"losses", FiniteList(g.ref_loss)},
                                   {"loss_err", FiniteList(to_golden.loss_err)},
                                   {"cpu_loss_err", FiniteList(to_golden.cpu_loss_err)},
                                   {"grad_norm_err", FiniteList(to_golden.grad_err)},
                                   {"cpu_grad_norm_err", FiniteList(to_golden.cpu_grad_err)},
                                   {"param_err", Finite(to_golden.param_err)},
                                   {"cpu_param_err", Finite(to_golden.cpu_param_err)}};
          double ratio = 0;
          for (const auto& c : against) {
            if (c.cpu > 0) ratio = std::max(ratio, c.backend / c.cpu);
            if (c.backend <= std::max(rtol, mult * c.cpu)) continue;
            Fail(item, std::isfinite(c.backend) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
                 fmt::format("{} is {:.3g} off the fp64 golden's (relative); the CPU's is at most {:.3g} (allowed "
                             "{}x that, or {:.3g})",
                             c.what, c.backend, c.cpu, mult, rtol));
          }
          item.error_ratio = ratio;
        }
      }
      if (item.outcome != Outcome::kPass) {
        Locate(item, program, backend, options,
               "every call of the first step is within its tolerance given the reference's inputs: the error "
               "accumulated over calls or steps");
      }
    }
  } catch (const std::exception& e) {
    Fail(item, Outcome::kError, "internal error in coverage while replaying the training step: " + FirstLine(e.what(), 500));
  }
  item.seconds = Since(start);
  return item;
}

std::vector<std::string> ModuleKinds(const Program& program) {
  // A kind is the path with every all-digit component replaced by '*'.
  auto kind_of = [](const std::string& path) {
    std::string out, part;
    auto flush = [&] {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
      out += (out.empty() ? "" : ".") + (digits ? std::string("*") : part);
      part.clear();
    };
    for (char c : path) {
      if (c == '.') {
        flush();
      } else {
        part += c;
      }
    }
    flush();
    return out;
  };
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (const auto& c : program.calls) {
    if (c.module.empty() || c.phase != "forward") continue;
    if (seen.insert(kind_of(c.module)).second) out.push_back(c.module);
  }
  return out;
}

// Note [Memory estimate]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Whether a model-level stage fits --max-gb is decided before it runs, from
// the program alone: the reference's side is replayed on the meta device
// (Mode::kShapes: every call's real output sizes and views, no memory), with
// the replay's own liveness (each value dropped after its last read, the
// outputs nothing reads kept for judging, training's parameters carried),
// storages counted once however many views look into them. Per call that
// gives the bytes alive on one side (L), the same in float64 (L64), the
// bytes its outputs created (F) and the fp32 operands the backend declares
// rounded (R, Note [Declared numerics]). The stage holds at most the larger of
//   replay: 2 L + F + 1.5 R (+ P, the first parameters kept in training)
//     the backend's side mirrors the reference's; a backend that is not the
//     CPU returns each result through a host copy (F), and a declared op's
//     operands are rounded in a bf16 copy widened back (1.5 R, one side at
//     a time);
//   golden: L64 + 2 J (J: the judged outputs at the end, the backend's and
//     the reference's; in training 3 P: the first parameters, the
//     reference's and the backend's after the last step)
//     the fp64 golden runs after the replay, while its verdicts wait;
// in the module stage both also hold 2 B, a copy per side of every value a
// checked module hands to a call outside it (judged as it crosses). Then
// 3% and kStageWorkingBytes more: the libraries' own working memory while
// a stage runs (thread pools, kernel scratch; 0.04-0.07 GB measured on the
// smallest representatives).
// Calls without a meta kernel (or with value-dependent
// sizes) get their outputs' sizes from the calls that read them. A stage
// runs with freed memory returned (backends/host.h), so what it holds is
// what its worker holds; bench/README.md measures the estimate against the
// worker's peak for every representative.
MemoryEstimate EstimateMemory(const Program& program, const std::string& stage, const ProgramReplayOptions& options,
                              bool backend_copies) {
  MemoryEstimate e;
  const bool train = stage == "train";
  try {
    programs::Replayer r(program, nullptr, options);
    programs::Failure f = r.Prepare();
    if (train && f.outcome == Outcome::kPass) r.CarryParameters(/*keep_initial=*/false);
    if (f.outcome == Outcome::kPass) f = r.Run(programs::Mode::kShapes);
    if (f.outcome != Outcome::kPass) {
      e.error = f.message;
      return e;
    }
    // The parameters' bytes, and the carried ones' (parameters and buffers, training only).
    double params = 0, carried = 0;
    for (const auto& v : program.values) {
      if (!v.tensor || (v.kind != "parameter" && v.kind != "buffer")) continue;
      const double bytes = static_cast<double>(v.tensor->StorageNumel()) * static_cast<double>(DTypeSize(v.tensor->dtype));
      if (v.kind == "parameter") params += bytes;
      if (train) carried += bytes;
    }
    const auto& samples = r.shape_samples();
    const double judged = samples.empty() ? 0 : std::max(0.0, static_cast<double>(samples.back().live) - carried);
    double boundary = 0;
    if (stage == "module") {
      std::set<std::string> checked;
      for (const std::string& m : ModuleKinds(program)) {
        if (!options.skip_modules.count(m)) checked.insert(m);
      }
      std::unordered_map<int64_t, const std::string*> made_in;
      std::set<int64_t> crossing;
      for (const auto& c : program.calls) {
        for (int64_t id : c.inputs) {
          auto maker = made_in.find(id);
          if (maker != made_in.end() && *maker->second != c.module && crossing.insert(id).second) {
            boundary += static_cast<double>(r.shape_bytes(id));
          }
        }
        if (!checked.count(c.module)) continue;
        for (int64_t id : c.outputs) {
          if (id >= 0) made_in.emplace(id, &c.module);
        }
      }
    }
    const double margin = kStageMemoryMargin;
    for (const auto& s : samples) {
      const double replay = 2.0 * static_cast<double>(s.live) + (backend_copies ? static_cast<double>(s.fresh) : 0.0) +
                            1.5 * static_cast<double>(s.rounded) + (train ? params : 0.0) + 2.0 * boundary;
      const double golden = static_cast<double>(s.live64) + (train ? 3.0 * params : 2.0 * judged) + 2.0 * boundary;
      e.replay_bytes = std::max(e.replay_bytes, margin * replay + kStageWorkingBytes);
      e.golden_bytes = std::max(e.golden_bytes, margin * golden + kStageWorkingBytes);
    }
    e.calls_without_shapes = r.calls_without_shapes();
  } catch (const std::exception& ex) {
    e.error = "internal error in coverage while sizing the program: " + FirstLine(ex.what(), 500);
    return e;
  }
  e.bytes = std::max(e.replay_bytes, e.golden_bytes);
  return e;
}

std::vector<ModelItemResult> RunProgramStage(const std::string& stage, const Program& program, Backend& backend,
                                             const ProgramReplayOptions& options) {
  // Few, large tensors: freed memory goes back, so what the stage holds is
  // what its process holds (backends/host.h).
  const backends::HostMemoryReturned returned;
  if (stage == "module") {
    std::vector<std::string> modules;
    for (std::string& m : ModuleKinds(program)) {
      if (!options.skip_modules.count(m)) modules.push_back(std::move(m));
    }
    if (modules.empty()) {
      ModelItemResult item;
      item.item = "*";
      item.outcome = Outcome::kSkipped;
      item.error = "no call of the program ran inside a module";
      return {item};
    }
    return ReplayModules(program, modules, backend, options);
  }
  if (stage == "train") return {ReplayTraining(program, backend, options)};
  if (stage == "model") return {ReplayProgram(program, backend, options)};
  ModelItemResult item;
  item.item = "*";
  item.outcome = Outcome::kError;
  item.error = "'" + stage + "' is not a model-level stage (module, model, train)";
  return {item};
}

std::vector<ModelItemResult> InProcessProgramStageRunner::Run(const std::string& stage, const std::string& /*model_id*/,
                                                              const std::string& /*profile*/, const Program& program) {
  return RunProgramStage(stage, program, backend_, options_);
}

}  // namespace coverage::replay

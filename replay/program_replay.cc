#include "replay/program_replay.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <set>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backends/backend.h"
#include "backends/dtype_map.h"
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
  int64_t elements = 0, mismatched = 0;
  for (const auto& o : outputs) {
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
  item.detail["outputs"] = outputs.size();
  item.detail["elements"] = elements;
  item.detail["mismatched"] = mismatched;
}

void TopK(ModelItemResult& item, const at::Tensor& backend, const at::Tensor& reference,
          const ModelCheckOptions& options) {
  const int64_t V = reference.size(-1);
  const at::Tensor r = reference.reshape({-1, V}).to(at::kFloat);
  const at::Tensor b = backend.reshape({-1, V}).to(at::kFloat);
  const int64_t k = std::min<int64_t>(std::max<int64_t>(1, options.top_k), V);
  const at::Tensor ref_top = std::get<1>(r.topk(k, -1));
  const at::Tensor top1 = b.argmax(-1, /*keepdim=*/true);
  const double agreement = (ref_top == top1).any(-1).to(at::kDouble).mean().item<double>();
  item.detail["top_k"] = k;
  item.detail["topk_agreement"] = agreement;
  item.detail["top1_agreement"] = (r.argmax(-1) == b.argmax(-1)).to(at::kDouble).mean().item<double>();
  if (agreement < options.min_topk_agreement) {
    Fail(item, Outcome::kMismatch,
         fmt::format("the backend's top-1 token is in the reference's top-{} at {:.1f}% of positions (needs {:.1f}%)",
                     k, 100 * agreement, 100 * options.min_topk_agreement));
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

// Judged outputs, golden asked for when they mismatch.
void JudgeWithGolden(ModelItemResult& item, const std::vector<Judged>& outputs,
                     const ProgramReplayOptions& options, const Program& program) {
  JudgeOutputs(item, outputs, [](int64_t) { return at::Tensor(); }, options);
  const bool ask = options.check.golden == GoldenMode::kAlways ||
                   (options.check.golden == GoldenMode::kWhenNeeded && item.outcome == Outcome::kMismatch);
  if (!ask) return;
  std::set<int64_t> ids;
  for (const auto& o : outputs) ids.insert(o.id);
  Replayer golden(program, nullptr, options);
  if (golden.Prepare().outcome != Outcome::kPass) return;
  golden.WantGolden(ids);
  if (golden.Run(Mode::kGolden).outcome != Outcome::kPass) return;
  JudgeOutputs(item, outputs, [&](int64_t id) { return golden.golden(id); }, options);
  item.detail["golden"] = true;
}

}  // namespace

ModelItemResult ReplayProgram(const Program& program, Backend& backend, const ProgramReplayOptions& options) {
  const auto start = Clock::now();
  ModelItemResult item;
  item.item = "forward";
  try {
    Replayer replayer(program, &backend, options);
    Failure f = replayer.Prepare();
    if (f.outcome == Outcome::kPass) f = replayer.Run(Mode::kFree);
    Stats(item, replayer, program);
    if (f.outcome != Outcome::kPass) {
      Fail(item, f.outcome, f.message);
      if (f.call >= 0) item.detail["failed_call"] = f.call;
    } else {
      const auto& outputs = replayer.judged();
      JudgeWithGolden(item, outputs, options, program);
      // The main output: the last floating one of the forward phase.
      const Judged* main = nullptr;
      for (const auto& o : outputs) {
        if (o.phase == "forward" && o.reference.is_floating_point() && o.meaningful) main = &o;
      }
      if (main) {
        item.detail["output_shape"] = main->reference.sizes().vec();
        if (LanguageModel(program) && main->reference.dim() >= 2 && main->backend.sizes() == main->reference.sizes() &&
            main->reference.size(-1) > 1) {
          TopK(item, main->backend, main->reference, options.check);
        }
      }
    }
    if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped && options.locate_first_divergent) {
      Replayer locate(program, &backend, options);
      if (locate.Prepare().outcome == Outcome::kPass) {
        const Failure lf = locate.Run(Mode::kLocate);
        if (!locate.divergent().is_null()) {
          item.detail["first_divergent"] = locate.divergent();
        } else if (lf.outcome == Outcome::kPass) {
          item.detail["first_divergent_note"] =
              "every call is within its tolerance given the reference's inputs: the error accumulated over calls";
        } else {
          item.detail["first_divergent_note"] = "the search stopped: " + lf.message;
        }
      }
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
    Replayer replayer(program, &backend, options);
    Failure f = replayer.Prepare();
    // A failure inside a module (a call the backend cannot run, a shape it
    // changes) is that module's, and the pass runs again without it, so one
    // module's unsupported call does not hide the others' verdicts; any
    // other failure stops them all.
    std::set<std::string> running(modules.begin(), modules.end());
    while (f.outcome == Outcome::kPass && !running.empty()) {
      f = replayer.Run(Mode::kModule, running);
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
        for (const auto& o : replayer.judged()) {
          if (o.module == modules[i]) outputs.push_back(o);
        }
        item.detail["calls"] = replayer.module_calls(modules[i]);
        item.detail["boundary_outputs"] = outputs.size();
        if (replayer.module_calls(modules[i]) == 0) {
          Fail(item, Outcome::kSkipped, "no call of the program ran in module '" + modules[i] + "'");
          continue;
        }
        if (outputs.empty()) {
          item.detail["note"] = "the module's values never leave it";
          continue;
        }
        JudgeWithGolden(item, outputs, options, program);
      }
    }
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

// The CPU as a backend: the reference's own run-to-run difference.
class CpuAgain final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  bool RespectsReadOnlyInputs() const override { return true; }
};

struct TrainDiff {
  double loss_rel = 0, grad_rel = 0, param_rel = 0;  // the worst over steps
  std::vector<double> ref_losses, dev_losses;
  // Per step: the loss's relative difference, the worst gradient's and which.
  std::vector<double> loss_rel_at, grad_rel_at;
  std::vector<size_t> grad_index_at;
};

double Relative(double backend, double reference, double floor) {
  if (!std::isfinite(backend) || !std::isfinite(reference)) return std::isfinite(backend) == std::isfinite(reference) ? 0 : INFINITY;
  return std::abs(backend - reference) / std::max(std::abs(reference), floor);
}

// N passes of the step program with parameters carried over; a pass that
// fails gives its Failure instead.
struct TrainRun {
  Failure failure;
  TrainDiff diff;
};

TrainRun Train(const Program& program, Backend& backend, const ProgramReplayOptions& options, int steps) {
  Replayer r(program, &backend, options);
  if (Failure f = r.Prepare(); f.outcome != Outcome::kPass) return {f, {}};
  r.CarryParameters();
  TrainDiff d;
  for (int step = 0; step < steps; ++step) {
    Failure f = r.Run(Mode::kFree);
    if (f.outcome != Outcome::kPass) {
      f.message = fmt::format("step {}: {}", step, f.message);
      return {f, {}};
    }
    const StepRecord& s = r.step();
    d.ref_losses.push_back(s.ref_loss);
    d.dev_losses.push_back(s.dev_loss);
    const double loss_rel = Relative(s.dev_loss, s.ref_loss, 1e-30);
    d.loss_rel_at.push_back(loss_rel);
    d.grad_rel_at.push_back(0);
    d.grad_index_at.push_back(0);
    if (!(loss_rel <= d.loss_rel)) d.loss_rel = loss_rel;
    // A gradient below a millionth of the step's total norm holds rounding
    // noise only: judged against that floor (Note [Model verdicts]).
    double total = 0;
    for (double g : s.ref_grad_norms) total += g * g;
    const double floor = std::max(1e-6 * std::sqrt(total), 1e-30);
    for (size_t w = 0; w < s.ref_grad_norms.size() && w < s.dev_grad_norms.size(); ++w) {
      const double rel = Relative(s.dev_grad_norms[w], s.ref_grad_norms[w], floor);
      if (!(rel <= d.grad_rel_at.back())) {
        d.grad_rel_at.back() = rel;
        d.grad_index_at.back() = w;
      }
      if (!(rel <= d.grad_rel)) d.grad_rel = rel;
    }
  }
  double diff2 = 0, update2 = 0;
  for (const auto& p : r.Parameters()) {
    const at::Tensor ref = p.ref.to(at::kDouble), dev = p.dev.to(at::kDouble), init = p.initial.to(at::kDouble);
    const double diff = (dev - ref).norm().item<double>(), update = (ref - init).norm().item<double>();
    diff2 += diff * diff;
    update2 += update * update;

  }
  d.param_rel = update2 > 0 ? std::sqrt(diff2 / update2) : (diff2 > 0 ? INFINITY : 0);
  return {{}, d};
}

nlohmann::json Finite(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json("inf"); }

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
    const TrainRun run = Train(program, backend, options, steps);
    const TrainDiff* diff = &run.diff;
    if (run.failure.outcome != Outcome::kPass) {
      Fail(item, run.failure.outcome, run.failure.message);
      if (run.failure.call >= 0) item.detail["failed_call"] = run.failure.call;
    } else {
      const bool low = [&] {
        for (const auto& v : program.values) {
          if (v.kind == "parameter" && v.tensor && (v.tensor->dtype == DType::kBFloat16 || v.tensor->dtype == DType::kFloat16)) return true;
        }
        return false;
      }();
      const double scale = low ? 10 : 1;
      double loss_tol = options.check.loss_rtol * scale, grad_tol = options.check.grad_norm_rtol * scale,
             param_tol = options.check.param_update_rtol * scale;
      auto judge = [&](const TrainDiff& d) {
        item.outcome = Outcome::kPass;
        item.error.clear();
        // The earliest miss names the item: a gradient of step s comes after
        // step s's loss and before step s+1's.
        for (size_t step = 0; step < d.loss_rel_at.size(); ++step) {
          if (!(d.loss_rel_at[step] <= loss_tol)) {
            Fail(item, std::isfinite(d.loss_rel_at[step]) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
                 fmt::format("step {}: loss {:.6g} differs from the reference's {:.6g} by {:.3g} (relative; allowed "
                             "{:.3g})",
                             step, d.dev_losses[step], d.ref_losses[step], d.loss_rel_at[step], loss_tol));
          }
          if (!(d.grad_rel_at[step] <= grad_tol)) {
            Fail(item, std::isfinite(d.grad_rel_at[step]) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
                 fmt::format("step {}: the norm of gradient {} differs from the reference's by {:.3g} (relative; "
                             "allowed {:.3g})",
                             step, d.grad_index_at[step], d.grad_rel_at[step], grad_tol));
          }
        }
        if (!(d.param_rel <= param_tol)) {
          Fail(item, std::isfinite(d.param_rel) ? Outcome::kMismatch : Outcome::kNonFiniteMismatch,
               fmt::format("parameters after {} steps differ from the reference's by {:.3g} of its update (allowed {:.3g})",
                           steps, d.param_rel, param_tol));
        }
      };
      judge(*diff);
      item.max_abs_err = 0;  // relative figures only (the details hold each)
      item.max_rel_err = std::max({diff->loss_rel, diff->grad_rel, diff->param_rel});
      item.cosine = 1;
      nlohmann::json ref_losses = nlohmann::json::array(), dev_losses = nlohmann::json::array();
      for (double v : diff->ref_losses) ref_losses.push_back(Finite(v));
      for (double v : diff->dev_losses) dev_losses.push_back(Finite(v));
      item.detail["reference_losses"] = ref_losses;
      item.detail["losses"] = dev_losses;
      item.detail["loss_rel"] = Finite(diff->loss_rel);
      item.detail["grad_norm_rel"] = Finite(diff->grad_rel);
      item.detail["param_update_rel"] = Finite(diff->param_rel);
      if (item.outcome != Outcome::kPass) {
        // Note [Reproducible training]: the reference against itself.
        CpuAgain cpu;
        const TrainRun again = Train(program, cpu, options, steps);
        const TrainDiff* self = &again.diff;
        if (again.failure.outcome == Outcome::kPass) {
          const double k = options.check.comparison.default_multiplier;
          item.detail["reference_reproducibility"] = {{"loss_rel", Finite(self->loss_rel)},
                                                      {"grad_norm_rel", Finite(self->grad_rel)},
                                                      {"param_update_rel", Finite(self->param_rel)}};
          const bool unreproducible = self->loss_rel > loss_tol || self->grad_rel > grad_tol || self->param_rel > param_tol;
          loss_tol = std::max(loss_tol, k * self->loss_rel);
          grad_tol = std::max(grad_tol, k * self->grad_rel);
          param_tol = std::max(param_tol, k * self->param_rel);
          const std::string strict = item.error;
          judge(*diff);
          if (item.outcome != Outcome::kPass && unreproducible) {
            item.outcome = Outcome::kSkipped;
            item.error = "no verdict: the CPU reference does not reproduce its own training at these tolerances (" +
                         strict + ")";
          }
        }
      }
      if (item.outcome != Outcome::kPass && item.outcome != Outcome::kSkipped && options.locate_first_divergent) {
        Replayer locate(program, &backend, options);
        if (locate.Prepare().outcome == Outcome::kPass) {
          const Failure lf = locate.Run(Mode::kLocate);
          if (!locate.divergent().is_null()) item.detail["first_divergent"] = locate.divergent();
          else if (lf.outcome != Outcome::kPass) item.detail["first_divergent_note"] = "the search stopped: " + lf.message;
        }
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

std::vector<ModelItemResult> RunProgramStage(const std::string& stage, const Program& program, Backend& backend,
                                             const ProgramReplayOptions& options) {
  if (stage == "module") {
    const auto modules = ModuleKinds(program);
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

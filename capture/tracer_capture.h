// RunTracerCapture: captures (model, profile) pairs with the capture tracer
// and stores their programs and op cases in the registry.
//
// One tracer process per pair (capture/tracer_process.h), `jobs` of them at
// once; each pair's records are parsed as they stream in and written by
// this thread in one transaction per pair (Registry::StoreProgram). A pair
// is skipped when the registry already holds its outcome from this tracer
// version, depth, device option, seed and config text, except a refusal
// when the budget is now larger (resumable and idempotent: an interrupted
// capture loses only the pairs in flight; `force` redoes every pair). What
// the tracer could not do is stored too, with its reason:
//   not_built       transformers cannot build the model offline (config or build stage:
//                   unknown model_type, remote code, an optional package, a rejected value)
//   not_applicable  the profile does not fit the model (a text profile on a vision model)
//   refused         a CPU run would exceed the tracer's --max-gb
//   failed          the trace raised (stage run), or the tracer timed out, went over the
//                   memory limit, crashed or wrote something unreadable
// Once a model is not built, its other profiles get the same outcome without
// another process.
//
// Torch-free. Thread safety: one call at a time per Registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/result.h"
#include "registry/registry.h"

namespace coverage::capture {

struct TracerSettings {
  std::string python;         // interpreter of the project venv
  std::string package_dir;    // the folder holding coverage_tracer/
  std::string profiles_path;  // profile definitions passed as --profiles
  int64_t max_layers = 2;     // --max-layers
  int64_t max_experts = 8;    // --max-experts (0: every expert)
  double max_gb = 4;          // --max-gb: the CPU-run budget the tracer checks before running
  std::string device = "auto";
  uint64_t seed = 0;
  double timeout_s = 900;          // per pair
  double memory_limit_gb = 0;      // resident limit per tracer; 0: max_gb + 3 (the libraries themselves)
  int threads = 0;                 // OMP threads per tracer; 0: cores / jobs
  // Fork every trace from a warm tracer per job (Note [Tracer server]) instead
  // of starting an interpreter and importing torch and transformers per pair.
  bool server = true;
};

struct CaptureModel {
  std::string id;
  std::string model_type;
  std::string source;       // e.g. "seed", "selection 3"
  std::string config_json;  // the config.json text
  std::string structure;    // when known: only profiles for this structure are tried; "": all
};

struct CaptureProfileRef {
  std::string name;
  std::vector<std::string> families;
};

struct TracerCaptureOptions {
  std::vector<CaptureModel> models;
  std::vector<CaptureProfileRef> profiles;
  TracerSettings tracer;
  int jobs = 1;
  bool force = false;
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

struct TracerCaptureSummary {
  int64_t pairs = 0;  // (model, profile) pairs considered
  int64_t captured = 0, not_built = 0, not_applicable = 0, refused = 0, failed = 0, skipped = 0;
  int64_t on_meta = 0, on_cpu = 0;  // captured pairs by device
  int64_t calls = 0;                // calls recorded in the captured pairs
  int64_t unsupported_calls = 0;
  int64_t cases_seen = 0;           // distinct cases per pair, summed
  int64_t cases_new = 0, cases_total = 0;
  int64_t models_captured = 0;      // models with at least one captured pair this time
  double seconds = 0;
  bool interrupted = false;
  std::map<std::string, int64_t> reasons;  // "status/stage: reason" -> pairs
};

// Errors: the tracer cannot be started (no venv), its command line is
// refused (every pair would fail the same way), or the registry fails.
Result<TracerCaptureSummary> RunTracerCapture(registry::Registry& registry, const TracerCaptureOptions& options);

// The programs row status for a tracer error stage.
std::string StatusForStage(const std::string& stage);

}  // namespace coverage::capture

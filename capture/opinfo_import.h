// ImportOpInfo: stores the calls of PyTorch's OpInfo samples as op cases
// (`coverage import opinfo`), next to the ones captured from real models.
//
// One tracer process (`python -m coverage_tracer opinfo`,
// capture/tracer/coverage_tracer/opinfo.py) runs every sample of the chosen
// OpInfos on CPU and writes each as a small trace; each trace is read with
// the TraceReader, as a model's program is. The calls of the kept ops (those
// the registry already holds, or all of them) become op cases with source
// `opinfo` (registry table opinfo_samples: OpInfo, variant, dtype, sample
// index and name). Each (OpInfo, dtype) is stored in one transaction as its
// samples end, with its opinfo_imports row: an interrupted import keeps what
// it stored and a rerun skips those (`force` redoes them). An OpInfo
// without samples for a dtype is stored as skipped with the reason; a
// sample that raises on CPU is counted and stores nothing.
//
// Torch-free. Thread safety: one call at a time per Registry.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "registry/registry.h"

namespace coverage::capture {

struct OpInfoImportOptions {
  std::string python;                // interpreter of the project venv
  std::string package_dir;           // the folder holding coverage_tracer/
  std::vector<std::string> dtypes;   // sample dtypes (f32, bf16, ...); empty: f32
  std::vector<std::string> opinfos;  // OpInfo names (NAME or NAME.VARIANT); empty: all
  // Ops whose calls are kept ("aten::mm", "mm", "add.Tensor"); empty: the
  // ops the registry holds, unless all_ops.
  std::vector<std::string> ops;
  bool all_ops = false;
  bool force = false;  // import (OpInfo, dtype) pairs stored before again
  uint64_t seed = 0;
  double timeout_s = 3600;  // the whole tracer run
  int threads = 1;          // OMP threads of the tracer
  bool progress = true;
  const std::atomic<bool>* stop = nullptr;
};

struct OpInfoImportSummary {
  int64_t imported = 0;       // (OpInfo, dtype) pairs stored this time
  int64_t skipped = 0;        // pairs without samples for the dtype (stored with the reason)
  int64_t done_before = 0;    // pairs stored by an earlier import, not run again
  int64_t samples = 0, failed_samples = 0;
  int64_t calls = 0;          // calls the samples made
  int64_t calls_kept = 0;     // of the kept ops, stored
  int64_t unsupported_calls = 0;  // kept ops whose arguments no op case holds
  int64_t cases_new = 0, cases_total = 0;
  int64_t kept_ops = 0;       // 0 with all_ops
  double seconds = 0;
  bool interrupted = false;
};

// Errors: the tracer cannot be started or fails as a whole (its stderr's
// tail in the message), its output is unreadable, or the registry fails.
// Pairs stored before such an error stay stored.
Result<OpInfoImportSummary> ImportOpInfo(registry::Registry& registry, const OpInfoImportOptions& options);

}  // namespace coverage::capture

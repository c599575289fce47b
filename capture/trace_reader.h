// TraceReader: parses what the capture tracer writes on stdout (JSON lines,
// capture/tracer/README.md) into a Program, or into the error the tracer
// reported. Strict: a line that is not a record of the documented shape is
// an error naming the line and the field, so a tracer that was cut off or
// printed something else is never stored as a short program.
//
// Torch-free. Thread safety: one reader per trace, used by one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "core/program.h"
#include "core/result.h"

namespace coverage::capture {

// The tracer this build runs (the start record's tracer_version): capture
// traces again a program stored by another version. Version 2 records the
// same records as 1; its input leaves carry the range they were drawn from
// as their domain (token ids in [0, vocab)), so version 1 programs are still
// read. Version 3 records scaled_dot_product_attention whole (and its
// backward as coverage::scaled_dot_product_attention_backward), with the
// trace device's decomposition by name, and AdamW's foreach step. Version 4
// records the same; its depth cut keeps a backbone's stage fields valid
// (DINOv2's out_features) and two layers of a kind that shares weights
// (Zamba's hybrid layers), and a dual tower's prefill (SigLIP) gets an image
// beside its text, so configs version 3 could not trace are traced again.
inline constexpr int kTracerVersion = 5;
inline constexpr int kOldestTracerVersionRead = 1;

// An `error` record: the tracer could not trace this (model, profile).
struct TraceError {
  std::string stage;      // config, build, profile, run, budget
  std::string reason;     // the library's own message
  std::string exception;  // the Python exception type, e.g. "ValueError"
};

struct TraceOutcome {
  std::optional<Program> program;  // a complete trace (start ... end)
  std::optional<TraceError> error;  // or the tracer's error record
};

class TraceReader {
 public:
  // One stdout line, without its newline. Errors: not JSON, not a record,
  // a field missing or of the wrong type, records out of order.
  Status Feed(std::string_view line);
  // Lines fed so far.
  int64_t lines() const { return line_no_; }
  // After the last line: the program (an `end` record was seen) or the
  // error record; anything else (no records, no `end`) is an error.
  Result<TraceOutcome> Finish();

 private:
  int64_t line_no_ = 0;
  bool started_ = false;
  bool ended_ = false;
  Program program_;
  std::optional<TraceError> error_;
};

}  // namespace coverage::capture

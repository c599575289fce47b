// TracerProcess: runs one capture tracer (python -m coverage_tracer) as a
// child process and streams its stdout lines to a callback, under a
// deadline and a memory limit.
//
// The child is spawned (never forked: the parent may hold libtorch's
// thread pools) in a process group of its own, so a terminal's Ctrl-C
// reaches only the parent, which then ends the child; the tracer also asks
// the kernel to kill it when the parent dies (COVERAGE_PARENT_PID). Its
// environment gets HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1, the tracer's
// package on PYTHONPATH and `threads` as OMP_NUM_THREADS. stdin carries the
// config, stdout the records, stderr is kept as a tail for errors.
//
// Torch-free. Thread safety: RunTracerProcess may run on several threads at
// once (one child each).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace coverage::capture {

struct TracerCommand {
  std::string python;                // the interpreter, e.g. <home>/.venv/bin/python
  std::string package_dir;           // the folder holding coverage_tracer/ (put on PYTHONPATH)
  std::vector<std::string> args;     // after `-m coverage_tracer`
  std::string stdin_text;            // written to the child's stdin, then closed
  double timeout_s = 600;            // wall-clock deadline
  double memory_limit_bytes = 0;     // resident memory limit (0 = none), checked every 100 ms
  int threads = 0;                   // OMP_NUM_THREADS for the child (0 = inherit)
  const std::atomic<bool>* stop = nullptr;  // set: end the child, return kInterrupted
  size_t stderr_tail_lines = 12;
};

struct TracerExit {
  enum class Kind {
    kExited,       // exited on its own (see exit_status)
    kSignaled,     // killed by a signal it did not get from us
    kTimeout,      // ran past timeout_s; killed
    kMemory,       // resident memory above the limit; killed
    kInterrupted,  // `stop` was set; killed
    kAborted,      // the line callback returned an error; killed
  };
  Kind kind = Kind::kExited;
  int exit_status = -1;
  int term_signal = 0;
  double seconds = 0;
  double peak_rss_bytes = 0;  // the largest resident size seen while polling
  std::string stderr_tail;    // its last lines, joined with newlines
  Status callback_error;      // kAborted: what the callback said

  // "exit status 3", "signal 11 (SIGSEGV)", "timed out after 600 s", ...
  std::string Description() const;
};

// Errors: the interpreter cannot be started. Everything the child does is a
// TracerExit.
Result<TracerExit> RunTracerProcess(const TracerCommand& command,
                                    const std::function<Status(std::string_view line)>& on_line);

// A tracer that imports torch and transformers once and forks a child per
// trace (Note [Tracer server] in capture/tracer/coverage_tracer/cli.py):
// Run behaves as RunTracerProcess does for the same command (same arguments,
// stdin, stdout lines, stderr tail, deadline, memory limit, stop), without a
// new interpreter and its imports per trace. The server itself holds no
// model; a trace that crashes ends only its child. One trace at a time per
// server (a capture job owns one). command.python, package_dir and threads
// are the server's, fixed at Start.
class TracerServer {
 public:
  // Errors: the interpreter cannot be started, or it did not say it is
  // ready (its imports done) within `ready_timeout_s`; it is then killed.
  static Result<std::unique_ptr<TracerServer>> Start(const std::string& python, const std::string& package_dir,
                                                     int threads, double ready_timeout_s = 120);
  ~TracerServer();  // ends the server and any trace it is running
  TracerServer(const TracerServer&) = delete;
  TracerServer& operator=(const TracerServer&) = delete;

  // Errors (IoError): the server is gone or stopped answering; the trace
  // did not run or its ending is unknown, and this server is unusable
  // (start another, or run the trace with RunTracerProcess). A server that
  // does not start the trace within its timeout_s is a kTimeout of the
  // trace's (the pair's deadline holds whatever hangs), and is unusable too.
  Result<TracerExit> Run(const TracerCommand& command, const std::function<Status(std::string_view line)>& on_line);
  // False once the server stopped answering: start another.
  bool usable() const { return socket_ >= 0; }

 private:
  TracerServer() = default;
  bool ReadLine(std::string* line, double timeout_s);
  int pid_ = -1;
  int socket_ = -1;
  std::string pending_;
};

}  // namespace coverage::capture

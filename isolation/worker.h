// WorkerProcess: one worker process of the `coverage` binary, spawned (never
// forked from a process that may already have touched a device) and spoken
// to over a socket with one JSON message per line. Torch-free: the parent
// that owns the results database never runs a case itself.
//
// Layout of the child (Note [Worker processes]):
//   fd 3       a Unix stream socket: requests in, replies out, one line each
//   fd 1, 2    one pipe the parent drains; its last lines name what a
//              crashing case printed
//   process    its own process group (a terminal's Ctrl-C reaches the parent
//              only; the parent stops cleanly and kills its workers), and
//              environment COVERAGE_WORKER=1, COVERAGE_ATTEMPT=<attempt>
// The child should arrange to die with its parent (PR_SET_PDEATHSIG), so a
// SIGKILL of the whole run leaves no worker behind; RunWorkerLoop does.
//
// Thread safety: a WorkerProcess is used by one thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/result.h"

namespace coverage::isolation {

// A line a worker prints on stderr to say where it is ("coverage-progress
// {\"call\": 41, ...}"): kept apart from its output, and reported with a
// crash or a timeout (Note [Where a worker died] in isolation.cc).
inline constexpr std::string_view kProgressPrefix = "coverage-progress ";

struct WorkerSpawnOptions {
  std::string executable;          // the binary; empty: this process's own (/proc/self/exe)
  std::vector<std::string> args;   // after argv[0], e.g. {"--home", "/src", "worker"}
  int attempt = 1;                 // exported as COVERAGE_ATTEMPT
  size_t stderr_tail_lines = 20;   // kept for crash reports
  // Note [A memory ceiling]: a worker whose resident memory passes this is
  // killed and the request ends kOverMemory; 0: no ceiling.
  int64_t memory_ceiling_bytes = 0;
};

// How one request ended.
struct WorkerReply {
  enum class Kind {
    kReply,    // a reply line arrived
    kDied,     // the worker exited or was killed by a signal before replying
    kTimeout,  // no reply before the deadline; the worker was killed
    kStopped,  // the caller's stop flag was set while it waited; the worker was killed
    kOverMemory,  // its resident memory passed the ceiling; the worker was killed
  };
  Kind kind = Kind::kReply;
  std::string line;         // kReply: the reply, without the newline
  int term_signal = 0;      // kDied: the signal that ended it, if any
  int exit_status = -1;     // kDied: its exit status, if it exited
  std::string stderr_tail;  // kDied, kTimeout: the last lines it printed
  // kDied, kTimeout: the last progress line the worker printed for this
  // request (kProgressPrefix, without it): where it was when it died.
  std::string progress;
  double seconds = 0;       // from sending to the reply (or death)
  // With a memory ceiling and measure_peak, the worker's peak resident
  // memory during this request (the kernel's high-water mark where it can be
  // reset, else the largest sample; 0 when not measured or unreadable).
  // kOverMemory: the sample that passed the ceiling.
  int64_t peak_rss_bytes = 0;
  int64_t memory_ceiling_bytes = 0;  // kOverMemory: the ceiling it passed
  // With a memory ceiling and measure_peak, the worker's resident memory
  // when the request was sent: what earlier requests left (its allocator keeps freed memory), so
  // peak - this is what the request itself added at least.
  int64_t start_rss_bytes = 0;

  // "signal 11 (SIGSEGV)" or "exit status 3".
  std::string DeathDescription() const;
};

class WorkerProcess {
 public:
  // Starts the child. Errors: the executable cannot be spawned.
  static Result<std::unique_ptr<WorkerProcess>> Spawn(const WorkerSpawnOptions& options);
  ~WorkerProcess();  // kills the child (its process group) and reaps it
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Sends `request` (one line, no newline inside) and waits up to
  // `timeout_s` for a reply, or until `*stop` is set (looked at every 200 ms
  // at most; nullptr: never). After kDied, kTimeout or kStopped the worker is
  // gone and every later Call returns kDied at once.
  // `measure_peak` (with a memory ceiling): reset the kernel's high-water
  // mark before the request and report it (Note [A memory ceiling]); two
  // /proc accesses a request, so only where the peak is used.
  WorkerReply Call(const std::string& request, double timeout_s, const std::atomic<bool>* stop = nullptr,
                   bool measure_peak = false);
  // Note [Pipelined requests]: Send queues a request without waiting (it is
  // written while a later Receive waits); Receive waits up to `timeout_s`
  // for the reply to the oldest request not yet answered. The worker answers
  // its requests in order, one line each, so a crash in the k-th leaves the
  // replies before it delivered and the ones after it unanswered. Call is
  // Send then Receive.
  void Send(const std::string& request);
  WorkerReply Receive(double timeout_s, const std::atomic<bool>* stop = nullptr, bool measure_peak = false);
  // Requests sent and not yet answered.
  int unanswered() const { return unanswered_; }

  bool alive() const { return alive_; }
  pid_t pid() const { return pid_; }
  int attempt() const { return attempt_; }

 private:
  WorkerProcess() = default;
  void DrainStderr(bool until_eof);
  void KillAndReap(WorkerReply* reply);
  std::string StderrTail() const;

  // Resident memory of the worker now (/proc/<pid>/statm), its high-water
  // mark (VmHWM), and resetting that mark; -1 / false when unreadable.
  int64_t ResidentBytes() const;
  int64_t PeakResidentBytes() const;
  bool ResetPeak() const;

  pid_t pid_ = -1;
  int attempt_ = 1;
  int64_t memory_ceiling_bytes_ = 0;
  int socket_fd_ = -1;
  int stderr_fd_ = -1;
  bool alive_ = false;
  bool stderr_eof_ = false;
  std::string pending_;              // bytes received after the last reply line
  std::string outgoing_;             // requests not yet written to the socket
  int unanswered_ = 0;
  std::string stderr_partial_;       // an unfinished stderr line
  std::deque<std::string> stderr_lines_;
  std::string last_progress_;  // this request's last progress line
  size_t stderr_tail_lines_ = 20;
};

// Name of a signal for people: "SIGSEGV"; "signal 77" when unknown.
std::string SignalName(int signal);

// The worker side: reads request lines from fd 3 and answers each with
// `handle(request)`, until the socket closes. Dies with the parent.
// Returns the process exit code.
int RunWorkerLoop(const std::function<std::string(const std::string& request)>& handle);

}  // namespace coverage::isolation

#include "isolation/worker.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "core/spawn.h"

extern char** environ;

namespace coverage::isolation {
namespace {

// Note [Worker processes]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Why spawn and not fork: a parent that has initialised a device runtime (or
// only libtorch's thread pools) cannot safely fork; a spawned child starts
// clean, exactly like the first process. Why a socket for requests: send()
// with MSG_NOSIGNAL turns a dead reader into EPIPE instead of killing the
// parent with SIGPIPE. Why a separate stderr pipe: a backend that prints to
// stdout must not corrupt replies, and the last lines it printed before a
// crash are the best clue to why. Why a process group of its own: Ctrl-C at
// a terminal signals the whole foreground group; a worker dying of SIGINT
// would be reported as a crash of the case it ran.
constexpr int kChildSocketFd = 3;

int MoveAbove(int fd, int min_fd) {
  if (fd >= min_fd) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, min_fd);
  close(fd);
  return moved;
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string SignalName(int signal) {
  switch (signal) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGPIPE: return "SIGPIPE";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    default: return fmt::format("signal {}", signal);
  }
}

std::string WorkerReply::DeathDescription() const {
  if (term_signal != 0) return fmt::format("signal {} ({})", term_signal, SignalName(term_signal));
  return fmt::format("exit status {}", exit_status);
}

Result<std::unique_ptr<WorkerProcess>> WorkerProcess::Spawn(const WorkerSpawnOptions& options) {
  // This very binary, even when its file was rebuilt or removed since it
  // started: /proc/self/exe names the running image, not the path.
  std::string exe = options.executable.empty() ? "/proc/self/exe" : options.executable;
  std::string argv0 = exe;
  if (options.executable.empty()) {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n > 0) argv0.assign(buf, static_cast<size_t>(n));
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
  }
  int err_pipe[2];
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(sv[0]);
    close(sv[1]);
    return Status::IoError(std::string("pipe: ") + std::strerror(errno));
  }
  // Keep the child's ends away from 0..3 so the dup2s below cannot collide.
  const int child_sock = MoveAbove(sv[1], 10), child_err = MoveAbove(err_pipe[1], 10);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_sock, kChildSocketFd);
  posix_spawn_file_actions_adddup2(&actions, child_err, 1);
  posix_spawn_file_actions_adddup2(&actions, child_err, 2);
  posix_spawnattr_t attr;
  InitChildSpawnAttributes(&attr);

  std::vector<std::string> env_storage;
  bool tunables = false;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "COVERAGE_ATTEMPT=", 17) == 0 || std::strncmp(*e, "COVERAGE_WORKER=", 16) == 0 ||
        std::strncmp(*e, "COVERAGE_PARENT_PID=", 20) == 0) {
      continue;
    }
    env_storage.emplace_back(*e);
    if (std::strncmp(*e, "GLIBC_TUNABLES=", 15) == 0) {
      tunables = true;
      if (env_storage.back().find("glibc.malloc.hugetlb") == std::string::npos) {
        env_storage.back() += std::strlen(*e) > 15 ? ":glibc.malloc.hugetlb=1" : "glibc.malloc.hugetlb=1";
      }
    }
  }
  // Note [Worker huge pages]: a worker's heap asks for transparent huge
  // pages (glibc's hugetlb=1 tunable, read at process start; where THP is
  // "madvise", as on Debian, the heap gets none otherwise). Replaying a case
  // touches gigabytes of fresh memory (a weight's fill, its device copy, the
  // golden's float64 copy), and on a virtual machine a 4 KiB page fault
  // costs more than the copy that takes it: on the main job's 159 embedding
  // and _grouped_mm cases, 55.7 s with 4 KiB pages and 35.8 s with huge
  // pages (bench/README.md). A hugetlb setting of the user's is kept.
  if (!tunables) env_storage.emplace_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
  env_storage.push_back("COVERAGE_WORKER=1");
  env_storage.push_back(fmt::format("COVERAGE_ATTEMPT={}", options.attempt));
  env_storage.push_back(fmt::format("COVERAGE_PARENT_PID={}", getpid()));
  std::vector<char*> envp;
  for (auto& s : env_storage) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> arg_storage = {argv0};
  arg_storage.insert(arg_storage.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (auto& s : arg_storage) argv.push_back(s.data());
  argv.push_back(nullptr);

  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(child_sock);
  close(child_err);
  if (rc != 0) {
    close(sv[0]);
    close(err_pipe[0]);
    return Status::IoError(fmt::format("cannot start worker '{}': {}", exe, std::strerror(rc)));
  }
  std::unique_ptr<WorkerProcess> w(new WorkerProcess());
  w->pid_ = pid;
  w->attempt_ = options.attempt;
  w->socket_fd_ = sv[0];
  w->stderr_fd_ = err_pipe[0];
  w->alive_ = true;
  w->stderr_tail_lines_ = options.stderr_tail_lines;
  w->memory_ceiling_bytes_ = options.memory_ceiling_bytes;
  fcntl(w->stderr_fd_, F_SETFL, fcntl(w->stderr_fd_, F_GETFL) | O_NONBLOCK);
  return w;
}

WorkerProcess::~WorkerProcess() {
  if (alive_) {
    // A polite end first: closing the socket ends the worker's loop.
    shutdown(socket_fd_, SHUT_RDWR);
    for (int i = 0; i < 50; ++i) {
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        alive_ = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (alive_) {
      WorkerReply ignored;
      KillAndReap(&ignored);
    }
  }
  if (socket_fd_ >= 0) close(socket_fd_);
  if (stderr_fd_ >= 0) close(stderr_fd_);
}

void WorkerProcess::DrainStderr(bool until_eof) {
  char buf[8192];
  for (;;) {
    ssize_t n = read(stderr_fd_, buf, sizeof(buf));
    if (n > 0) {
      stderr_partial_.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = stderr_partial_.find('\n', start)) != std::string::npos) {
        std::string line = stderr_partial_.substr(start, nl - start);
        start = nl + 1;
        if (line.compare(0, kProgressPrefix.size(), kProgressPrefix) == 0) {
          last_progress_ = line.substr(kProgressPrefix.size());
          continue;
        }
        stderr_lines_.push_back(std::move(line));
        if (stderr_lines_.size() > stderr_tail_lines_) stderr_lines_.pop_front();
      }
      stderr_partial_.erase(0, start);
      if (stderr_partial_.size() > 4096) {  // a runaway line without newline
        stderr_lines_.push_back(stderr_partial_.substr(0, 4096) + "...");
        stderr_partial_.clear();
      }
      continue;
    }
    if (n == 0) {
      stderr_eof_ = true;  // every writer closed it; poll must stop watching it
      return;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN && until_eof) {
      pollfd p{stderr_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) > 0) continue;  // the dead child's last bytes are in the pipe already
    }
    return;
  }
}

std::string WorkerProcess::StderrTail() const {
  std::string out;
  for (const auto& l : stderr_lines_) out += l + "\n";
  if (!stderr_partial_.empty()) out += stderr_partial_ + "\n";
  return out;
}

// Note [A memory ceiling]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A replay whose memory estimate undercounts must not take the machine down:
// the kernel's OOM killer then picks any process (the run's parent, a
// browser), and its kill reads as the backend's crash. So the parent watches
// each worker's resident memory while it waits for a reply (every 50 ms
// when a ceiling is set; /proc/<pid>/statm is one small read) and kills a
// worker that passes the ceiling itself; the request ends kOverMemory, which
// the stages record as `skipped` with "over memory: peak X GB > ceiling Y
// GB", never as a crash or a flaky result. Memory of processes the backend
// starts is not counted. cgroup v2's memory.max would be exact, but needs a
// delegated cgroup the machine may not give (this one has cgroup v1 only);
// the watchdog works wherever /proc does. A request that asks for it
// (a model stage's: Call's measure_peak) also gets its peak: the kernel's
// high-water mark (VmHWM), reset before the request (clear_refs 5), so
// estimates can be checked against it; a unit case, milliseconds long,
// pays for neither.
int64_t WorkerProcess::ResidentBytes() const {
  std::ifstream statm("/proc/" + std::to_string(pid_) + "/statm");
  int64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t WorkerProcess::PeakResidentBytes() const {
  std::ifstream status("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;  // "VmHWM:   123456 kB"
  }
  return -1;
}

bool WorkerProcess::ResetPeak() const {
  std::ofstream clear("/proc/" + std::to_string(pid_) + "/clear_refs");
  clear << "5";
  return static_cast<bool>(clear.flush());
}

void WorkerProcess::KillAndReap(WorkerReply* reply) {
  kill(-pid_, SIGKILL);  // its process group: anything the backend started goes too
  kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) reply->term_signal = WTERMSIG(status);
  if (WIFEXITED(status)) reply->exit_status = WEXITSTATUS(status);
  alive_ = false;
}

WorkerReply WorkerProcess::Call(const std::string& request, double timeout_s, const std::atomic<bool>* stop,
                                bool measure_peak) {
  Send(request);
  return Receive(timeout_s, stop, measure_peak);
}

void WorkerProcess::Send(const std::string& request) {
  outgoing_ += request;
  outgoing_ += '\n';
  ++unanswered_;
  if (!alive_) return;
  // As much as the socket takes now, so the worker has its next request
  // while the caller does other work; Receive writes the rest (and notices
  // a dead worker).
  const ssize_t w = send(socket_fd_, outgoing_.data(), outgoing_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w > 0) outgoing_.erase(0, static_cast<size_t>(w));
}

WorkerReply WorkerProcess::Receive(double timeout_s, const std::atomic<bool>* stop, bool measure_peak) {
  WorkerReply reply;
  const auto start = std::chrono::steady_clock::now();
  if (!alive_) {
    reply.kind = WorkerReply::Kind::kDied;
    reply.stderr_tail = StderrTail();
    return reply;
  }
  if (unanswered_ <= 1) {
    // What the worker printed belongs to this request alone; with requests
    // queued behind it (Note [Pipelined requests]) the tail rolls on instead.
    stderr_lines_.clear();
    stderr_partial_.clear();
    last_progress_.clear();
  }
  const bool watch = memory_ceiling_bytes_ > 0;
  const bool peak_reset = watch && measure_peak && ResetPeak();
  if (peak_reset) reply.start_rss_bytes = std::max<int64_t>(ResidentBytes(), 0);
  int64_t sampled = 0;
  auto last_sample = start;
  auto sample = [&] {  // at most every 50 ms: a short request costs no read at all
    if (std::chrono::steady_clock::now() - last_sample < std::chrono::milliseconds(50)) return int64_t{0};
    last_sample = std::chrono::steady_clock::now();
    const int64_t now = ResidentBytes();
    sampled = std::max(sampled, now);
    return now;
  };
  auto peak = [&] {
    const int64_t hwm = peak_reset ? PeakResidentBytes() : -1;
    return std::max(sampled, hwm);
  };
  auto reap = [&](int status) {
    if (WIFSIGNALED(status)) reply.term_signal = WTERMSIG(status);
    if (WIFEXITED(status)) reply.exit_status = WEXITSTATUS(status);
    alive_ = false;
    kill(-pid_, SIGKILL);  // whatever it started goes with it
  };
  auto died = [&](bool reaped) {
    // The socket closed or the child is gone: reap it (waiting a little for
    // a clean exit) and keep what it printed last.
    reply.kind = WorkerReply::Kind::kDied;
    if (!reaped) {
      int status = 0;
      pid_t r = 0;
      for (int i = 0; i < 500 && (r = waitpid(pid_, &status, WNOHANG)) == 0; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (r == pid_) reap(status);
      else KillAndReap(&reply);
    }
    DrainStderr(true);
    reply.stderr_tail = StderrTail();
    reply.progress = last_progress_;
    reply.seconds = SecondsSince(start);
    reply.peak_rss_bytes = sampled;
    return reply;
  };
  for (;;) {
    // A reply already buffered: the oldest unanswered request's.
    if (size_t nl = pending_.find('\n'); nl != std::string::npos) {
      reply.line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      --unanswered_;
      reply.seconds = SecondsSince(start);
      reply.peak_rss_bytes = std::max<int64_t>(peak(), 0);
      return reply;
    }
    if (watch && sample() > memory_ceiling_bytes_) {  // Note [A memory ceiling]
      reply.kind = WorkerReply::Kind::kOverMemory;
      reply.peak_rss_bytes = sampled;
      reply.memory_ceiling_bytes = memory_ceiling_bytes_;
      KillAndReap(&reply);
      DrainStderr(true);
      reply.stderr_tail = StderrTail();
      reply.progress = last_progress_;
      reply.seconds = SecondsSince(start);
      return reply;
    }
    const double left = timeout_s - SecondsSince(start);
    const bool stopped = stop != nullptr && stop->load();
    if (left <= 0 || stopped) {
      reply.kind = stopped ? WorkerReply::Kind::kStopped : WorkerReply::Kind::kTimeout;
      KillAndReap(&reply);
      DrainStderr(true);
      reply.stderr_tail = StderrTail();
      reply.progress = last_progress_;
      reply.seconds = SecondsSince(start);
      return reply;
    }
    pollfd fds[2] = {{socket_fd_, static_cast<short>(POLLIN | (!outgoing_.empty() ? POLLOUT : 0)), 0},
                     {stderr_eof_ ? -1 : stderr_fd_, POLLIN, 0}};
    const int wait_ms = static_cast<int>(std::min(left * 1000.0 + 1, memory_ceiling_bytes_ > 0 ? 50.0 : 200.0));
    int n = poll(fds, 2, wait_ms);
    if (n < 0 && errno != EINTR) return died(false);
    if (n <= 0) {
      // A child the worker started may hold the socket open after the worker
      // died: look at the worker itself too.
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        reap(status);
        return died(true);
      }
      continue;
    }
    if (fds[1].revents & (POLLIN | POLLHUP)) DrainStderr(false);
    if (!outgoing_.empty() && (fds[0].revents & POLLOUT)) {
      ssize_t w = send(socket_fd_, outgoing_.data(), outgoing_.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) outgoing_.erase(0, static_cast<size_t>(w));
      else if (w < 0 && errno != EAGAIN && errno != EINTR) return died(false);
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char buf[65536];
      ssize_t r = recv(socket_fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (r > 0) {
        pending_.append(buf, static_cast<size_t>(r));
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        return died(false);
      }
    }
  }
}

int RunWorkerLoop(const std::function<std::string(const std::string&)>& handle) {
  // Die with the parent, even a SIGKILLed one; if it is already gone, stop.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (const char* parent = std::getenv("COVERAGE_PARENT_PID"); parent && std::atol(parent) != getppid()) return 1;
  // Processes the backend starts must not hold the socket: the parent
  // learns of a death from its end closing.
  fcntl(kChildSocketFd, F_SETFD, FD_CLOEXEC);
  std::string pending;
  char buf[65536];
  for (;;) {
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      std::string request = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      std::string reply;
      try {
        reply = handle(request) + "\n";
      } catch (const std::exception& e) {
        // A bug in answering must not look like a crash of the case.
        std::string what = std::string(e.what()).substr(0, 200);
        for (char& c : what) {
          // Kept to plain ASCII without quotes or escapes, so the line is valid JSON.
          if (static_cast<unsigned char>(c) >= 0x80 || static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\') {
            c = '?';
          }
        }
        reply = "{\"error\": \"the worker failed to answer: " + what + "\"}\n";
      }
      size_t sent = 0;
      while (sent < reply.size()) {
        ssize_t w = send(kChildSocketFd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return 0;  // the parent is gone
        sent += static_cast<size_t>(w);
      }
    }
    ssize_t r = recv(kChildSocketFd, buf, sizeof(buf), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return 0;
    pending.append(buf, static_cast<size_t>(r));
  }
}

}  // namespace coverage::isolation

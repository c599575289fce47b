#include "capture/tracer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <array>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/spawn.h"

extern char** environ;

namespace coverage::capture {
namespace {

double ResidentBytes(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/statm", pid));
  long long size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int MoveAbove(int fd, int min_fd) {
  if (fd >= min_fd) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, min_fd);
  close(fd);
  return moved;
}

// Splits what arrives on a pipe into lines.
struct LineBuffer {
  std::string partial;
  template <typename F>
  void Add(const char* data, size_t n, F&& on_line) {
    partial.append(data, n);
    size_t start = 0, nl;
    while ((nl = partial.find('\n', start)) != std::string::npos) {
      on_line(std::string_view(partial).substr(start, nl - start));
      start = nl + 1;
    }
    partial.erase(0, start);
  }
};

std::string SignalName(int s) {
  const char* name = sigabbrev_np(s);
  return name ? fmt::format("SIG{}", name) : fmt::format("signal {}", s);
}

// The tracer's environment: this process's, with the tracer package on
// PYTHONPATH, offline Hub settings, the parent's pid and the thread count.
std::vector<std::string> TracerEnvironment(const std::string& package_dir, int threads) {
  std::vector<std::string> env;
  std::string pythonpath = package_dir;
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    if (v.starts_with("PYTHONPATH=")) {
      if (v.size() > 11) pythonpath += ":" + std::string(v.substr(11));
      continue;
    }
    if (v.starts_with("HF_HUB_OFFLINE=") || v.starts_with("TRANSFORMERS_OFFLINE=") ||
        v.starts_with("COVERAGE_PARENT_PID=") || (threads > 0 && v.starts_with("OMP_NUM_THREADS="))) {
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  env.push_back("HF_HUB_OFFLINE=1");
  env.push_back("TRANSFORMERS_OFFLINE=1");
  env.push_back("PYTHONUNBUFFERED=1");
  env.push_back(fmt::format("COVERAGE_PARENT_PID={}", getpid()));
  if (threads > 0) env.push_back(fmt::format("OMP_NUM_THREADS={}", threads));
  return env;
}

}  // namespace

std::string TracerExit::Description() const {
  switch (kind) {
    case Kind::kExited: return fmt::format("exit status {}", exit_status);
    case Kind::kSignaled: return fmt::format("killed by signal {} ({})", term_signal, SignalName(term_signal));
    case Kind::kTimeout: return fmt::format("no result after {:.0f} s (timed out)", seconds);
    case Kind::kMemory:
      return fmt::format("resident memory reached {:.2f} GB, over the limit", peak_rss_bytes / 1e9);
    case Kind::kInterrupted: return "interrupted";
    case Kind::kAborted: return "stopped: " + callback_error.message();
  }
  return "unknown";
}

namespace {

// The three pipes of one tracer: the child's ends (above 0..2, so the dup2s
// that make them its stdin, stdout and stderr cannot collide) and ours.
struct Pipes {
  int child_in = -1, child_out = -1, child_err = -1;
  int to_child = -1, from_child = -1, err_child = -1;
  void CloseChildEnds() {
    for (int* fd : {&child_in, &child_out, &child_err}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }
  void CloseAll() {
    CloseChildEnds();
    for (int* fd : {&to_child, &from_child, &err_child}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
  }
};

Result<Pipes> MakePipes() {
  int in_pipe[2], out_pipe[2], err_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return Status::IoError(std::string("pipe: ") + std::strerror(errno));
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return Status::IoError(std::string("pipe: ") + std::strerror(errno));
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    for (int fd : {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1]}) close(fd);
    return Status::IoError(std::string("pipe: ") + std::strerror(errno));
  }
  Pipes p;
  p.child_in = MoveAbove(in_pipe[0], 10);
  p.child_out = MoveAbove(out_pipe[1], 10);
  p.child_err = MoveAbove(err_pipe[1], 10);
  p.to_child = in_pipe[1];
  p.from_child = out_pipe[0];
  p.err_child = err_pipe[0];
  return p;
}

// Watches a started tracer `pid` (leader of its own process group): writes
// its stdin, streams its stdout lines to `on_line`, keeps the tail of its
// stderr, and kills its group on `stop`, the deadline or the memory limit,
// until both of its output pipes are closed. Does not reap it; closes our
// ends of the pipes. Sets `killed` when it killed the group.
TracerExit Watch(pid_t pid, Pipes& pipes, const TracerCommand& command,
                 const std::function<Status(std::string_view line)>& on_line,
                 std::chrono::steady_clock::time_point start, bool* killed_out) {
  int& to_child = pipes.to_child;
  int& from_child = pipes.from_child;
  int& err_child = pipes.err_child;
  SetNonBlocking(to_child);
  SetNonBlocking(from_child);
  SetNonBlocking(err_child);

  TracerExit exit;
  size_t written = 0;
  if (command.stdin_text.empty()) {
    close(to_child);
    to_child = -1;
  }
  LineBuffer out_lines, err_lines;
  std::deque<std::string> tail;
  bool killed = false;
  const auto kill_child = [&](TracerExit::Kind why) {
    if (killed) return;
    killed = true;
    exit.kind = why;
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);  // in case it had not made its group yet
  };
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto next_rss_check = std::chrono::steady_clock::now();
  char buf[65536];
  while (from_child >= 0 || err_child >= 0) {
    pollfd fds[3];
    nfds_t n = 0;
    int out_index = -1, err_index = -1, in_index = -1;
    if (from_child >= 0) {
      out_index = static_cast<int>(n);
      fds[n++] = {from_child, POLLIN, 0};
    }
    if (err_child >= 0) {
      err_index = static_cast<int>(n);
      fds[n++] = {err_child, POLLIN, 0};
    }
    if (to_child >= 0) {
      in_index = static_cast<int>(n);
      fds[n++] = {to_child, POLLOUT, 0};
    }
    const int ready = poll(fds, n, 100);
    if (ready < 0 && errno != EINTR) break;
    if (!killed) {
      if (command.stop && command.stop->load()) kill_child(TracerExit::Kind::kInterrupted);
      if (seconds() > command.timeout_s) kill_child(TracerExit::Kind::kTimeout);
      if (std::chrono::steady_clock::now() >= next_rss_check) {
        next_rss_check = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        const double rss = ResidentBytes(pid);
        exit.peak_rss_bytes = std::max(exit.peak_rss_bytes, rss);
        if (command.memory_limit_bytes > 0 && rss > command.memory_limit_bytes) kill_child(TracerExit::Kind::kMemory);
      }
    }
    if (ready <= 0) continue;
    if (in_index >= 0 && (fds[in_index].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t w = (fds[in_index].revents & POLLOUT)
                      ? write(to_child, command.stdin_text.data() + written, command.stdin_text.size() - written)
                      : -1;
      if (w > 0) written += static_cast<size_t>(w);
      if (w < 0 && errno == EAGAIN) w = 0;
      if (w < 0 || written == command.stdin_text.size()) {
        close(to_child);
        to_child = -1;
      }
    }
    if (out_index >= 0 && (fds[out_index].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = read(from_child, buf, sizeof(buf));
      if (r > 0) {
        if (!killed) {
          out_lines.Add(buf, static_cast<size_t>(r), [&](std::string_view line) {
            if (killed) return;
            Status s = on_line(line);
            if (!s.ok()) {
              exit.callback_error = std::move(s);
              kill_child(TracerExit::Kind::kAborted);
            }
          });
        }
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(from_child);
        from_child = -1;
      }
    }
    if (err_index >= 0 && (fds[err_index].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t r = read(err_child, buf, sizeof(buf));
      if (r > 0) {
        err_lines.Add(buf, static_cast<size_t>(r), [&](std::string_view line) {
          tail.emplace_back(line.substr(0, 2000));
          if (tail.size() > command.stderr_tail_lines) tail.pop_front();
        });
      } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(err_child);
        err_child = -1;
      }
    }
  }
  pipes.CloseAll();
  // A last line without its newline is still a line.
  if (!killed && !out_lines.partial.empty()) {
    Status s = on_line(out_lines.partial);
    if (!s.ok()) {
      exit.callback_error = std::move(s);
      exit.kind = TracerExit::Kind::kAborted;
    }
  }
  if (!err_lines.partial.empty()) tail.push_back(err_lines.partial.substr(0, 2000));
  for (size_t i = 0; i < tail.size(); ++i) {
    if (i) exit.stderr_tail += '\n';
    exit.stderr_tail += tail[i];
  }
  *killed_out = killed;
  return exit;
}

// The child's wait status, unless Watch already decided how it ended.
void SetEnding(TracerExit& exit, int status, bool killed) {
  if (killed || exit.kind == TracerExit::Kind::kAborted) return;
  if (WIFEXITED(status)) {
    exit.kind = TracerExit::Kind::kExited;
    exit.exit_status = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit.kind = TracerExit::Kind::kSignaled;
    exit.term_signal = WTERMSIG(status);
  }
}

// Spawns `python -m coverage_tracer <args>` with `fds` (each -1 or a
// descriptor) as its 0, 1, 2 and 3, in a process group of its own.
Result<pid_t> SpawnTracer(const std::string& python, const std::string& package_dir, int threads,
                          const std::vector<std::string>& tracer_args, const std::array<int, 4>& fds) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int target = 0; target < 4; ++target) {
    if (fds[target] >= 0) posix_spawn_file_actions_adddup2(&actions, fds[target], target);
  }
  posix_spawnattr_t attr;
  InitChildSpawnAttributes(&attr);
  std::vector<std::string> env = TracerEnvironment(package_dir, threads);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {python, "-m", "coverage_tracer"};
  args.insert(args.end(), tracer_args.begin(), tracer_args.end());
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, python.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    return Status::IoError(fmt::format("cannot start the capture tracer with '{}': {}", python, std::strerror(rc)));
  }
  return pid;
}

}  // namespace

Result<TracerExit> RunTracerProcess(const TracerCommand& command,
                                    const std::function<Status(std::string_view line)>& on_line) {
  COV_ASSIGN_OR_RETURN(Pipes pipes, MakePipes());
  const auto start = std::chrono::steady_clock::now();
  auto pid = SpawnTracer(command.python, command.package_dir, command.threads, command.args,
                         {pipes.child_in, pipes.child_out, pipes.child_err, -1});
  pipes.CloseChildEnds();
  if (!pid) {
    pipes.CloseAll();
    return pid.error();
  }
  bool killed = false;
  TracerExit exit = Watch(*pid, pipes, command, on_line, start, &killed);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Anything it started in its group goes with it.
  kill(-*pid, SIGKILL);
  exit.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SetEnding(exit, status, killed);
  return exit;
}

// ---- the tracer server (Note [Tracer server] in coverage_tracer/cli.py) ----

Result<std::unique_ptr<TracerServer>> TracerServer::Start(const std::string& python, const std::string& package_dir,
                                                          int threads, double ready_timeout_s) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
  }
  const int theirs = MoveAbove(sv[1], 10);
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto pid = SpawnTracer(python, package_dir, threads, {"--serve"}, {devnull, -1, -1, theirs});
  close(theirs);
  if (devnull >= 0) close(devnull);
  if (!pid) {
    close(sv[0]);
    return pid.error();
  }
  auto server = std::unique_ptr<TracerServer>(new TracerServer());
  server->pid_ = *pid;
  server->socket_ = sv[0];
  std::string line;
  if (!server->ReadLine(&line, ready_timeout_s) || line != "ready") {
    return Status::IoError(fmt::format("the tracer server did not get ready within {:g} s", ready_timeout_s));
  }  // the destructor ends it
  return server;
}

TracerServer::~TracerServer() {
  if (socket_ >= 0) close(socket_);  // the server reads end-of-file and exits
  if (pid_ > 0) {
    kill(-pid_, SIGKILL);
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

bool TracerServer::ReadLine(std::string* line, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (true) {
    const size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      *line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{socket_, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) return false;
    if (ready <= 0) continue;
    char buf[256];
    const ssize_t r = recv(socket_, buf, sizeof(buf), 0);
    if (r <= 0) return false;  // the server is gone
    pending_.append(buf, static_cast<size_t>(r));
  }
}

Result<TracerExit> TracerServer::Run(const TracerCommand& command,
                                     const std::function<Status(std::string_view line)>& on_line) {
  if (socket_ < 0) return Status::IoError("the tracer server has stopped");
  COV_ASSIGN_OR_RETURN(Pipes pipes, MakePipes());
  const auto start = std::chrono::steady_clock::now();
  const std::string request = nlohmann::json(command.args).dump();
  // The child's three ends travel with the request (SCM_RIGHTS).
  int fds[3] = {pipes.child_in, pipes.child_out, pipes.child_err};
  char control[CMSG_SPACE(sizeof(fds))] = {};
  iovec iov{const_cast<char*>(request.data()), request.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
  std::memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
  const ssize_t sent = sendmsg(socket_, &msg, MSG_NOSIGNAL);
  pipes.CloseChildEnds();
  std::string line;
  const auto stopped = [&](const std::string& why) {
    pipes.CloseAll();
    close(socket_);
    socket_ = -1;
    return Status::IoError("the tracer server " + why);
  };
  if (sent != static_cast<ssize_t>(request.size())) return stopped("did not take the request");
  // A ready server forks at once: one that has not answered when the
  // trace's own deadline passes is stuck, and the trace timed out.
  if (!ReadLine(&line, command.timeout_s)) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    Status why = stopped("did not start the trace");
    if (waited < command.timeout_s) return why;  // it closed the socket: gone, not hung
    TracerExit timeout;
    timeout.kind = TracerExit::Kind::kTimeout;
    timeout.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    timeout.stderr_tail = "the warm tracer did not start the trace";
    return timeout;
  }
  pid_t pid = 0;
  try {
    pid = static_cast<pid_t>(std::stol(line));
  } catch (const std::exception&) {
    return stopped("answered '" + line + "' instead of a process id");
  }
  if (pid <= 0) return stopped("answered '" + line + "' instead of a process id");
  bool killed = false;
  TracerExit exit = Watch(pid, pipes, command, on_line, start, &killed);
  // The child has closed its output (or was killed): its status follows.
  // Something it left running in its group (holding the pipes open) goes now.
  kill(-pid, SIGKILL);
  // The child is gone: its wait status comes at once.
  if (!ReadLine(&line, 10)) return stopped("did not say how the trace ended");
  int status = 0;
  try {
    status = std::stoi(line);
  } catch (const std::exception&) {
    return stopped("answered '" + line + "' instead of a wait status");
  }
  exit.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  SetEnding(exit, status, killed);
  return exit;
}

}  // namespace coverage::capture

#include "capture/tracer_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>

#include <fmt/format.h>

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

Result<TracerExit> RunTracerProcess(const TracerCommand& command,
                                    const std::function<Status(std::string_view line)>& on_line) {
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
  // The child's ends above 0..2 so the dup2s cannot collide.
  const int child_in = MoveAbove(in_pipe[0], 10), child_out = MoveAbove(out_pipe[1], 10),
            child_err = MoveAbove(err_pipe[1], 10);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_in, 0);
  posix_spawn_file_actions_adddup2(&actions, child_out, 1);
  posix_spawn_file_actions_adddup2(&actions, child_err, 2);
  posix_spawnattr_t attr;
  InitChildSpawnAttributes(&attr);

  std::vector<std::string> env;
  std::string pythonpath = command.package_dir;
  for (char** e = environ; *e; ++e) {
    std::string_view v(*e);
    if (v.starts_with("PYTHONPATH=")) {
      if (v.size() > 11) pythonpath += ":" + std::string(v.substr(11));
      continue;
    }
    if (v.starts_with("HF_HUB_OFFLINE=") || v.starts_with("TRANSFORMERS_OFFLINE=") ||
        v.starts_with("COVERAGE_PARENT_PID=") || (command.threads > 0 && v.starts_with("OMP_NUM_THREADS="))) {
      continue;
    }
    env.emplace_back(v);
  }
  env.push_back("PYTHONPATH=" + pythonpath);
  env.push_back("HF_HUB_OFFLINE=1");
  env.push_back("TRANSFORMERS_OFFLINE=1");
  env.push_back("PYTHONUNBUFFERED=1");
  env.push_back(fmt::format("COVERAGE_PARENT_PID={}", getpid()));
  if (command.threads > 0) env.push_back(fmt::format("OMP_NUM_THREADS={}", command.threads));
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = {command.python, "-m", "coverage_tracer"};
  args.insert(args.end(), command.args.begin(), command.args.end());
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, command.python.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(child_in);
  close(child_out);
  close(child_err);
  int to_child = in_pipe[1], from_child = out_pipe[0], err_child = err_pipe[0];
  if (rc != 0) {
    for (int fd : {to_child, from_child, err_child}) close(fd);
    return Status::IoError(fmt::format("cannot start the capture tracer with '{}': {}", command.python,
                                       std::strerror(rc)));
  }
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
  };
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  auto next_rss_check = start;
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
  if (to_child >= 0) close(to_child);
  if (from_child >= 0) close(from_child);
  if (err_child >= 0) close(err_child);
  // A last line without its newline is still a line.
  if (!killed && !out_lines.partial.empty()) {
    Status s = on_line(out_lines.partial);
    if (!s.ok()) {
      exit.callback_error = std::move(s);
      exit.kind = TracerExit::Kind::kAborted;
    }
  }
  if (!err_lines.partial.empty()) tail.push_back(err_lines.partial.substr(0, 2000));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // Anything it started in its group goes with it.
  kill(-pid, SIGKILL);
  exit.seconds = seconds();
  if (!killed && exit.kind != TracerExit::Kind::kAborted) {
    if (WIFEXITED(status)) {
      exit.kind = TracerExit::Kind::kExited;
      exit.exit_status = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      exit.kind = TracerExit::Kind::kSignaled;
      exit.term_signal = WTERMSIG(status);
    }
  }
  for (size_t i = 0; i < tail.size(); ++i) {
    if (i) exit.stderr_tail += '\n';
    exit.stderr_tail += tail[i];
  }
  return exit;
}

}  // namespace coverage::capture

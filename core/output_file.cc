#include "core/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace coverage {
namespace {

std::string Reason(int error) { return std::strerror(error); }

// Writes all of `text` to `fd`; errno's value on failure, else 0.
int WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

Status WriteThrough(const std::string& path, std::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return Status::IoError("cannot write '" + path + "': " + Reason(errno));
  const int error = WriteAll(fd, text);
  const int closed = ::close(fd) == 0 ? 0 : errno;
  if (error != 0 || closed != 0) return Status::IoError("cannot write '" + path + "': " + Reason(error ? error : closed));
  return Status::Ok();
}

}  // namespace

Status WriteOutputFile(const std::string& path, std::string_view text) {
  if (path.empty()) return Status::InvalidArgument("no output path given");
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;  // through symlinks (/dev/stdout, /proc/self/fd/1)
  if (exists && S_ISDIR(st.st_mode)) return Status::IoError("cannot write '" + path + "': it is a folder");
  if (exists && !S_ISREG(st.st_mode)) return WriteThrough(path, text);
  std::string target = path;
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    // The link stays; the file it names is what gets replaced.
    char resolved[PATH_MAX];
    if (!exists || ::realpath(path.c_str(), resolved) == nullptr) {
      return Status::IoError("cannot write '" + path + "': it is a symlink to a path that does not exist");
    }
    target = resolved;
  }

  // A fresh name beside the target, opened exclusively (O_EXCL never
  // follows a symlink, whatever is planted there).
  std::vector<char> name(target.begin(), target.end());
  const std::string suffix = ".tmp.XXXXXX";
  name.insert(name.end(), suffix.begin(), suffix.end());
  name.push_back('\0');
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return Status::IoError("cannot write '" + path + "': " + Reason(errno));
  const std::string tmp(name.data());
  // The mode a new file gets (or the replaced file's own).
  mode_t mode = 0;
  if (exists) {
    mode = st.st_mode & 07777;
  } else {
    const mode_t mask = ::umask(0);
    ::umask(mask);
    mode = 0666 & ~mask;
  }
  int error = ::fchmod(fd, mode) == 0 ? 0 : errno;
  if (error == 0) error = WriteAll(fd, text);
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(tmp.c_str(), target.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(tmp.c_str());
    return Status::IoError("cannot write '" + path + "': " + Reason(error) +
                           (exists ? " (the previous file is unchanged)" : ""));
  }
  return Status::Ok();
}

}  // namespace coverage

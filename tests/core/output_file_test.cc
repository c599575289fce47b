// WriteOutputFile (core/output_file.h): a regular file is replaced
// atomically, anything else is written through and never replaced, and a
// file planted at a temporary name is never opened.
#include "core/output_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace coverage {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/coverage-output-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { fs::remove_all(path); }
};

size_t Entries(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(OutputFile, ARegularFileIsReplacedAndNothingIsLeftBeside) {
  TempDir d;
  const fs::path out = d.path / "report.json";
  ASSERT_TRUE(WriteOutputFile(out, "first").ok());
  ::chmod(out.c_str(), 0640);
  ASSERT_TRUE(WriteOutputFile(out, "second").ok());
  EXPECT_EQ(Slurp(out), "second");
  EXPECT_EQ(fs::status(out).permissions() & fs::perms::all, fs::perms(0640)) << "the replaced file keeps its mode";
  EXPECT_EQ(Entries(d.path), 1u);
}

TEST(OutputFile, ACharacterDeviceIsWrittenThroughNotReplaced) {
  ASSERT_TRUE(WriteOutputFile("/dev/null", "discarded").ok());
  EXPECT_TRUE(fs::is_character_file("/dev/null"));
  // A full device: the write fails with its reason, and it stays a device.
  const Status full = WriteOutputFile("/dev/full", std::string(1 << 16, 'x'));
  EXPECT_FALSE(full.ok());
  EXPECT_NE(full.message().find("No space left on device"), std::string::npos) << full.message();
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
  // A descriptor's magic link (what /dev/stdout is): through, to the pipe.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const std::string fd_path = "/proc/self/fd/" + std::to_string(pipe_fds[1]);
  EXPECT_TRUE(WriteOutputFile(fd_path, "piped").ok());
  ::close(pipe_fds[1]);
  char buf[16] = {0};
  EXPECT_EQ(::read(pipe_fds[0], buf, sizeof buf), 5);
  ::close(pipe_fds[0]);
  EXPECT_EQ(std::string(buf), "piped");
}

TEST(OutputFile, AFifoIsWrittenThroughToItsReader) {
  TempDir d;
  const fs::path fifo = d.path / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string got;
  std::thread reader([&] { got = Slurp(fifo); });
  EXPECT_TRUE(WriteOutputFile(fifo, "through the pipe").ok());
  reader.join();
  EXPECT_EQ(got, "through the pipe");
  EXPECT_TRUE(fs::is_fifo(fifo));
}

TEST(OutputFile, ASymlinkStaysAndTheFileItNamesIsReplaced) {
  TempDir d;
  const fs::path real = d.path / "real.html", link = d.path / "latest.html";
  std::ofstream(real) << "old";
  fs::create_symlink(real, link);
  ASSERT_TRUE(WriteOutputFile(link, "new").ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(Slurp(real), "new");
  // A link to nothing is refused, creating nothing.
  fs::create_symlink(d.path / "nowhere", d.path / "dangling");
  EXPECT_FALSE(WriteOutputFile(d.path / "dangling", "x").ok());
  EXPECT_FALSE(fs::exists(d.path / "nowhere"));
}

TEST(OutputFile, AFilePlantedAtTheOldTemporaryNameIsNeverOpened) {
  TempDir d;
  const fs::path out = d.path / "export.csv", victim = d.path / "victim";
  std::ofstream(victim) << "keep me";
  fs::create_symlink(victim, d.path / "export.csv.tmp");
  ASSERT_TRUE(WriteOutputFile(out, "rows").ok());
  EXPECT_EQ(Slurp(victim), "keep me");
  EXPECT_EQ(Slurp(out), "rows");
  EXPECT_TRUE(fs::is_symlink(d.path / "export.csv.tmp"));
}

TEST(OutputFile, AFolderOrAMissingFolderIsAClearError) {
  TempDir d;
  const Status folder = WriteOutputFile(d.path, "x");
  EXPECT_FALSE(folder.ok());
  EXPECT_NE(folder.message().find("is a folder"), std::string::npos) << folder.message();
  const Status missing = WriteOutputFile(d.path / "no" / "such.json", "x");
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("No such file or directory"), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace coverage

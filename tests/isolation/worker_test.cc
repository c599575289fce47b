// WorkerProcess and the isolated executors against scripted workers
// (/bin/sh speaking the worker protocol on fd 3): replies, crashes, hangs,
// exits, what the worker printed, reruns in fresh workers.
#include <cstdlib>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "isolation/isolation.h"
#include "isolation/protocol.h"
#include "isolation/worker.h"
#include "tests/support/case_builder.h"

namespace coverage::isolation {
using namespace coverage::backends;  // backends/'s names, unqualified in these tests
using namespace coverage::replay;  // replay/'s names, unqualified in these tests
namespace {

// The protocol's parsers on lines of every shape (isolation/protocol.h);
// the cases below are what fuzz/worker_protocol.cc found throwing.
TEST(WorkerProtocol, SetupReplyOfAnyShapeIsReadyOrAnError) {
  EXPECT_TRUE(ParseSetupReply(R"({"ready": true, "backend_version": "x"})").has_value());
  auto declared = ParseSetupReply(R"({"ready": true, "numerics": "{\"fp32_operands\": \"bf16\"}"})");
  ASSERT_TRUE(declared.has_value());
  EXPECT_EQ(declared->numerics, R"({"fp32_operands": "bf16"})");
  EXPECT_EQ(ParseSetupReply(R"({"ready": true, "numerics": 7})")->numerics, "");
  for (const char* line : {R"({"ready": 1})", R"({"ready": "yes"})", R"({"error": 3})", "[]", "not json"}) {
    Status s = ParseSetupReply(line).error();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << line;
    EXPECT_EQ(s.message(), line);
  }
  EXPECT_EQ(ParseSetupReply(R"({"ready": false, "error": "no such backend"})").error().message(), "no such backend");
}

TEST(WorkerProtocol, RepliesOfAnotherShapeAreErrorValues) {
  EXPECT_EQ(ParseUnitReply(R"({"result": {"outcome": "pass", "error": []}})").error().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(ParseUnitReply(R"({"result": 3})").error().code(), StatusCode::kInternal);
  for (const char* line : {R"({"items": [{"item": 3, "outcome": "pass"}]})",
                           R"({"items": [{"item": "forward", "outcome": ["pass"]}]})",
                           R"({"items": [{"item": "forward", "outcome": "pass", "seconds": "1"}]})"}) {
    auto items = ParseModelReply(line);
    ASSERT_FALSE(items) << line;
    EXPECT_EQ(items.error().code(), StatusCode::kCorruption) << line;
  }
  auto items = ParseModelReply(R"({"items": [{"item": "forward", "outcome": "mismatch", "cosine": 0.5}]})");
  ASSERT_TRUE(items);
  ASSERT_EQ(items->size(), 1u);
  EXPECT_EQ((*items)[0].outcome, Outcome::kMismatch);
}

// fuzz_worker_protocol found a float where an integer belongs (warm
// iterations of 6.7e32) converted to int: undefined behaviour. Integers are
// now read only from whole numbers within range, and anything else is an
// error naming the member.
TEST(WorkerProtocol, SetupIntegersOutOfRangeOrFractionalAreErrorsNamingTheMember) {
  auto ok = WorkerSetup::FromJson(nlohmann::json::parse(
      R"({"backend": "cpu", "warm_iterations": 5, "seed": 18446744073709551615, "checks": {"top_k": 7}})"));
  ASSERT_TRUE(ok.has_value()) << ok.error().ToString();
  EXPECT_EQ(ok->warm_iterations, 5);
  EXPECT_EQ(ok->seed, 18446744073709551615ull);
  EXPECT_EQ(ok->checks.top_k, 7);
  for (const char* text : {R"({"backend": "cpu", "warm_iterations": 6.66667e+32})",
                           R"({"backend": "cpu", "warm_iterations": 2.5})",
                           R"({"backend": "cpu", "warm_iterations": 4294967296})",
                           R"({"backend": "cpu", "seed": -1})",
                           R"({"backend": "cpu", "checks": {"train_steps": 1e300}})",
                           R"({"backend": "cpu", "checks": {"top_k": "5"}})"}) {
    auto bad = WorkerSetup::FromJson(nlohmann::json::parse(text));
    ASSERT_FALSE(bad.has_value()) << text;
    EXPECT_EQ(bad.error().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(bad.error().message().find("expected a whole number"), std::string::npos) << bad.error().message();
  }
}


WorkerSpawnOptions Shell(const std::string& script, int attempt = 1) {
  WorkerSpawnOptions o;
  o.executable = "/bin/sh";
  o.args = {"-c", script};
  o.attempt = attempt;
  return o;
}

// True when `pid` no longer runs (gone, or a zombie waiting for init).
bool Gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && line.size() > paren + 2 && line[paren + 2] == 'Z';
}

TEST(Worker, RepliesArriveOnItsSocketAndStdoutDoesNotCorruptThem) {
  auto w = WorkerProcess::Spawn(Shell("while read -r l <&3; do echo noise; echo \"got:$l\" >&3; done"));
  ASSERT_TRUE(w.has_value()) << w.error().ToString();
  for (const char* msg : {"hello", "second"}) {
    WorkerReply r = (*w)->Call(msg, 10);
    ASSERT_EQ(r.kind, WorkerReply::Kind::kReply);
    EXPECT_EQ(r.line, std::string("got:") + msg);
  }
  EXPECT_TRUE((*w)->alive());
}

// Note [Pipelined requests]: requests queued without waiting are answered
// in order, one reply each.
TEST(Worker, PipelinedRequestsAreAnsweredInOrder) {
  auto w = WorkerProcess::Spawn(Shell("while read -r l <&3; do echo \"got:$l\" >&3; done"));
  ASSERT_TRUE(w.has_value()) << w.error().ToString();
  for (const char* msg : {"a", "b", "c"}) (*w)->Send(msg);
  EXPECT_EQ((*w)->unanswered(), 3);
  for (const char* msg : {"a", "b", "c"}) {
    WorkerReply r = (*w)->Receive(10);
    ASSERT_EQ(r.kind, WorkerReply::Kind::kReply);
    EXPECT_EQ(r.line, std::string("got:") + msg);
  }
  EXPECT_EQ((*w)->unanswered(), 0);
  EXPECT_EQ((*w)->Call("d", 10).line, "got:d");
}

TEST(Worker, ACrashIsReportedWithItsSignalAndLastOutput) {
  auto w = WorkerProcess::Spawn(Shell("read -r l <&3; echo 'about to crash' >&2; kill -SEGV $$"));
  ASSERT_TRUE(w.has_value());
  WorkerReply r = (*w)->Call("go", 10);
  EXPECT_EQ(r.kind, WorkerReply::Kind::kDied);
  EXPECT_EQ(r.term_signal, SIGSEGV);
  EXPECT_NE(r.DeathDescription().find("SIGSEGV"), std::string::npos) << r.DeathDescription();
  EXPECT_NE(r.stderr_tail.find("about to crash"), std::string::npos) << r.stderr_tail;
  EXPECT_FALSE((*w)->alive());
  EXPECT_EQ((*w)->Call("again", 10).kind, WorkerReply::Kind::kDied);  // at once, no new process
}

// Note [Where a worker died]: the last progress line of the request is kept
// apart from the worker's output and reported with its death.
TEST(Worker, TheLastProgressLineSaysWhereItDied) {
  auto w = WorkerProcess::Spawn(Shell(
      "read -r l <&3; echo 'coverage-progress {\"call\": 1}' >&2; echo 'coverage-progress {\"call\": 2, \"op\": "
      "\"aten::topk\", \"module\": \"m\"}' >&2; echo 'other output' >&2; kill -SEGV $$"));
  ASSERT_TRUE(w.has_value());
  WorkerReply r = (*w)->Call("go", 10);
  EXPECT_EQ(r.kind, WorkerReply::Kind::kDied);
  EXPECT_EQ(r.progress, R"({"call": 2, "op": "aten::topk", "module": "m"})");
  EXPECT_EQ(r.stderr_tail.find("coverage-progress"), std::string::npos) << r.stderr_tail;
  EXPECT_NE(r.stderr_tail.find("other output"), std::string::npos) << r.stderr_tail;
}

TEST(Worker, AnExitStatusIsReported) {
  auto w = WorkerProcess::Spawn(Shell("read -r l <&3; exit 3"));
  ASSERT_TRUE(w.has_value());
  WorkerReply r = (*w)->Call("go", 10);
  EXPECT_EQ(r.kind, WorkerReply::Kind::kDied);
  EXPECT_EQ(r.term_signal, 0);
  EXPECT_EQ(r.exit_status, 3);
}

TEST(Worker, AHangTimesOutAndItsWholeProcessGroupIsKilled) {
  auto w = WorkerProcess::Spawn(Shell("sleep 1000 & echo \"child $!\" >&2; read -r l <&3; sleep 1000"));
  ASSERT_TRUE(w.has_value());
  const pid_t pid = (*w)->pid();
  const auto start = std::chrono::steady_clock::now();
  WorkerReply r = (*w)->Call("go", 0.5);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.kind, WorkerReply::Kind::kTimeout);
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 5.0);
  EXPECT_TRUE(Gone(pid));
  const size_t at = r.stderr_tail.find("child ");
  ASSERT_NE(at, std::string::npos) << r.stderr_tail;
  const pid_t child = std::stoi(r.stderr_tail.substr(at + 6));
  for (int i = 0; i < 100 && !Gone(child); ++i) usleep(10000);
  EXPECT_TRUE(Gone(child)) << "the worker's own child survived";
}

// Ctrl-C while a worker hangs (say, loading its backend): the wait ends
// within its 200 ms poll, long before the deadline, and the worker is gone.
TEST(Worker, AStopFlagEndsTheWaitAtOnceAndKillsTheWorker) {
  auto w = WorkerProcess::Spawn(Shell("read -r l <&3; sleep 1000"));
  ASSERT_TRUE(w.has_value());
  const pid_t pid = (*w)->pid();
  std::atomic<bool> stop{false};
  std::thread presser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
  });
  const auto start = std::chrono::steady_clock::now();
  WorkerReply r = (*w)->Call("go", 300, &stop);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  presser.join();
  EXPECT_EQ(r.kind, WorkerReply::Kind::kStopped);
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0);
  EXPECT_TRUE(Gone(pid));
  EXPECT_FALSE((*w)->alive());
}

TEST(Worker, ADeathIsSeenAtOnceEvenWhenAChildHoldsTheSocket) {
  // The worker's child inherits fd 3 and keeps the socket open after the
  // worker dies: the death must still be a crash, not a timeout.
  auto w = WorkerProcess::Spawn(Shell("sleep 30 & read -r l <&3; kill -SEGV $$"));
  ASSERT_TRUE(w.has_value());
  WorkerReply r = (*w)->Call("go", 10);
  EXPECT_EQ(r.kind, WorkerReply::Kind::kDied);
  EXPECT_EQ(r.term_signal, SIGSEGV);
  EXPECT_LT(r.seconds, 3.0);
}

TEST(Worker, AWorkerThatClosesItsOutputDoesNotMakeTheParentSpin) {
  auto w = WorkerProcess::Spawn(Shell("exec 1>&- 2>&-; read -r l <&3; sleep 1; echo done >&3"));
  ASSERT_TRUE(w.has_value());
  const std::clock_t cpu = std::clock();
  WorkerReply r = (*w)->Call("go", 10);
  EXPECT_EQ(r.line, "done");
  EXPECT_LT(static_cast<double>(std::clock() - cpu) / CLOCKS_PER_SEC, 0.5) << "busy-waited on a closed pipe";
}

// Note [A memory ceiling]: each reply carries the request's own peak (the
// high-water mark is reset before every request), and a worker past the
// ceiling is killed with the figure that passed it.
TEST(Worker, AReplyCarriesItsRequestsPeakMemoryAndTheCeilingIsEnforced) {
  WorkerSpawnOptions o;
  o.executable = "/usr/bin/env";
  o.args = {"python3", "-c",
            "import os, time\n"
            "for size in (200, 1, 600):\n"
            "    os.read(3, 100)\n"
            "    x = b'1' * (size << 20)\n"
            "    if size > 400: time.sleep(30)  # held until the parent kills it\n"
            "    del x\n"
            "    os.write(3, b'done\\n')\n"};
  o.memory_ceiling_bytes = int64_t{400} << 20;
  auto w = WorkerProcess::Spawn(o);
  ASSERT_TRUE(w.has_value()) << w.error().ToString();
  WorkerReply big = (*w)->Call("one", 20, nullptr, /*measure_peak=*/true);
  ASSERT_EQ(big.kind, WorkerReply::Kind::kReply) << big.stderr_tail;
  EXPECT_GT(big.peak_rss_bytes, int64_t{200} << 20);
  EXPECT_LT(big.peak_rss_bytes, int64_t{400} << 20);
  EXPECT_GT(big.start_rss_bytes, 0);
  EXPECT_LT(big.start_rss_bytes, int64_t{100} << 20);
  WorkerReply small = (*w)->Call("two", 20, nullptr, /*measure_peak=*/true);
  ASSERT_EQ(small.kind, WorkerReply::Kind::kReply) << small.stderr_tail;
  EXPECT_LT(small.peak_rss_bytes, int64_t{150} << 20) << "the mark was not reset between requests";
  const pid_t pid = (*w)->pid();
  WorkerReply over = (*w)->Call("three", 20, nullptr, /*measure_peak=*/true);
  EXPECT_EQ(over.kind, WorkerReply::Kind::kOverMemory);
  EXPECT_GT(over.peak_rss_bytes, int64_t{400} << 20);
  EXPECT_EQ(over.memory_ceiling_bytes, int64_t{400} << 20);
  EXPECT_TRUE(Gone(pid));
}

TEST(Worker, TheAttemptIsInItsEnvironment) {
  auto w = WorkerProcess::Spawn(Shell("read -r l <&3; echo \"$COVERAGE_ATTEMPT:$COVERAGE_WORKER\" >&3", 3));
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ((*w)->Call("go", 10).line, "3:1");
}

// Note [Worker huge pages]: the worker's heap asks for huge pages, unless
// the user's GLIBC_TUNABLES says otherwise.
TEST(Worker, ItsHeapAsksForHugePagesAndKeepsTheUsersTunables) {
  const char* saved = std::getenv("GLIBC_TUNABLES");
  const std::string restore = saved ? saved : "";
  auto tunables_seen = [] {
    auto w = WorkerProcess::Spawn(Shell("read -r l <&3; echo \"$GLIBC_TUNABLES\" >&3"));
    EXPECT_TRUE(w.has_value());
    return w ? (*w)->Call("go", 10).line : std::string();
  };
  unsetenv("GLIBC_TUNABLES");
  EXPECT_EQ(tunables_seen(), "glibc.malloc.hugetlb=1");
  setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2", 1);
  EXPECT_EQ(tunables_seen(), "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1");
  setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0", 1);
  EXPECT_EQ(tunables_seen(), "glibc.malloc.hugetlb=0");
  if (saved) {
    setenv("GLIBC_TUNABLES", restore.c_str(), 1);
  } else {
    unsetenv("GLIBC_TUNABLES");
  }
}

TEST(Worker, DestroyingItEndsAndReapsTheProcess) {
  pid_t pid;
  {
    auto w = WorkerProcess::Spawn(Shell("while read -r l <&3; do echo ok >&3; done; sleep 1000"));
    ASSERT_TRUE(w.has_value());
    pid = (*w)->pid();
    EXPECT_EQ((*w)->Call("x", 10).line, "ok");
  }
  EXPECT_NE(kill(pid, 0), 0) << "the worker was not reaped";
}

TEST(Worker, AMissingExecutableIsAClearError) {
  WorkerSpawnOptions o;
  o.executable = "/nonexistent/coverage";
  auto w = WorkerProcess::Spawn(o);
  ASSERT_FALSE(w.has_value());
  EXPECT_NE(w.error().message().find("/nonexistent/coverage"), std::string::npos) << w.error().ToString();
}

// A scripted worker for the executors: answers the setup, then runs `body`
// for each request (the request line is in $l).
IsolationOptions ScriptedWorker(const std::string& body, int reruns) {
  IsolationOptions o;
  o.spawn.executable = "/bin/sh";
  o.spawn.args = {"-c", "read -r s <&3; echo '{\"ready\":true}' >&3; while read -r l <&3; do " + body + "; done"};
  o.setup.backend = "scripted";
  o.policy.unit_timeout_s = 1;
  o.policy.startup_timeout_s = 10;
  o.policy.reruns = reruns;
  return o;
}

constexpr const char* kPass = R"(echo '{"result":{"outcome":"pass","error":""}}' >&3)";
constexpr const char* kMismatch = R"(echo '{"result":{"outcome":"mismatch","error":"off by one"}}' >&3)";

TEST(IsolatedCaseExecutor, APassingCaseRunsOnceInTheLongLivedWorker) {
  IsolatedCaseExecutor e(ScriptedWorker(kPass, 3));
  ASSERT_TRUE(e.Start().ok());
  for (int i = 0; i < 3; ++i) {
    CaseResult r = e.Run(testing::MulCase({2, 3}));
    EXPECT_EQ(r.outcome, Outcome::kPass);
    EXPECT_EQ(r.attempts, 1);
  }
  EXPECT_EQ(e.stats().workers_started, 1);
  EXPECT_TRUE(e.HarnessStatus().ok());
}

TEST(IsolatedCaseExecutor, ACrashIsAttributedAndTheNextCaseGetsAFreshWorker) {
  // Crashes on requests for tensors of 7 rows, answers the rest.
  IsolatedCaseExecutor e(ScriptedWorker(
      std::string("case \"$l\" in *\"[7,3]\"*) echo 'dying now' >&2; kill -SEGV $$;; *) ") + kPass + ";; esac", 0));
  ASSERT_TRUE(e.Start().ok());
  CaseResult crashed = e.Run(testing::MulCase({7, 3}));
  EXPECT_EQ(crashed.outcome, Outcome::kCrash);
  EXPECT_NE(crashed.error.find("SIGSEGV"), std::string::npos) << crashed.error;
  EXPECT_NE(crashed.error.find("aten::mul.Tensor"), std::string::npos) << crashed.error;
  EXPECT_NE(crashed.error.find("dying now"), std::string::npos) << crashed.error;
  auto detail = nlohmann::json::parse(crashed.detail_json);
  EXPECT_EQ(detail["worker"]["signal"], SIGSEGV);
  EXPECT_EQ(e.Run(testing::MulCase({2, 3})).outcome, Outcome::kPass);
  EXPECT_EQ(e.stats().workers_started, 2);
  EXPECT_EQ(e.stats().crashes, 1);
}

// Note [Pipelined requests]: a batch runs in the long-lived worker with
// requests queued; a crash costs its own case, and the cases queued behind
// it run in the next worker. Each result says which worker gave it ($$).
TEST(IsolatedCaseExecutor, ABatchSharesAWorkerAndACrashCostsOnlyItsCase) {
  IsolatedCaseExecutor e(ScriptedWorker(
      "case \"$l\" in *\"[7,3]\"*) kill -SEGV $$;; "
      "*) echo \"{\\\"result\\\":{\\\"outcome\\\":\\\"pass\\\",\\\"error\\\":\\\"$$\\\"}}\" >&3;; esac",
      0));
  ASSERT_TRUE(e.Start().ok());
  std::vector<OpCase> cases;
  for (int64_t rows = 1; rows <= 12; ++rows) cases.push_back(testing::MulCase({rows, 3}));
  std::vector<const OpCase*> batch;
  for (const OpCase& c : cases) batch.push_back(&c);
  std::vector<size_t> order;
  std::vector<CaseResult> results(cases.size());
  e.RunMany(batch, [&](size_t i, CaseResult r) {
    order.push_back(i);
    results[i] = std::move(r);
  });
  ASSERT_TRUE(e.HarnessStatus().ok()) << e.HarnessStatus().ToString();
  std::vector<size_t> all(cases.size());
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(order, all);  // each once, in order (nothing ran again)
  EXPECT_EQ(results[6].outcome, Outcome::kCrash);
  EXPECT_NE(results[6].error.find("SIGSEGV"), std::string::npos) << results[6].error;
  const std::string first_worker = results[0].error, second_worker = results[7].error;
  EXPECT_NE(first_worker, second_worker);
  for (size_t i = 0; i < cases.size(); ++i) {
    if (i == 6) continue;
    EXPECT_EQ(results[i].outcome, Outcome::kPass) << i;
    EXPECT_EQ(results[i].error, i < 6 ? first_worker : second_worker) << i;
  }
  EXPECT_EQ(e.stats().workers_started, 2);
  EXPECT_EQ(e.stats().crashes, 1);
}

// A wrong answer in a batch runs again as Run would run it, after the rest.
TEST(IsolatedCaseExecutor, AWrongAnswerInABatchRunsAgainAfterTheRest) {
  IsolatedCaseExecutor e(ScriptedWorker(std::string("case \"$l\" in *\"[2,3]\"*) ") + kMismatch + ";; *) " + kPass +
                                        ";; esac", 1));
  ASSERT_TRUE(e.Start().ok());
  const OpCase a = testing::MulCase({1, 3}), b = testing::MulCase({2, 3}), c = testing::MulCase({3, 3});
  std::vector<size_t> order;
  std::vector<CaseResult> results(3);
  e.RunMany({&a, &b, &c}, [&](size_t i, CaseResult r) {
    order.push_back(i);
    results[i] = std::move(r);
  });
  EXPECT_EQ(order, (std::vector<size_t>{0, 2, 1}));
  EXPECT_EQ(results[1].outcome, Outcome::kMismatch);
  EXPECT_EQ(results[1].attempts, 2);  // reproduced exactly in the same worker: settled
  EXPECT_FALSE(results[1].flaky);
  EXPECT_EQ(results[0].outcome, Outcome::kPass);
  EXPECT_EQ(e.stats().workers_started, 1);
}

TEST(IsolatedCaseExecutor, OutputThatIsNotUtf8IsKeptReadableAndNothingThrows) {
  IsolatedCaseExecutor e(ScriptedWorker("printf 'bad \\377\\376 bytes\\n' >&2; kill -SEGV $$", 0));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kCrash);
  EXPECT_NE(r.error.find("bad"), std::string::npos) << r.error;
  EXPECT_FALSE(nlohmann::json::parse(r.detail_json, nullptr, false).is_discarded());
  EXPECT_FALSE(nlohmann::json::parse(r.ToJson(), nullptr, false).is_discarded());
}

TEST(IsolatedCaseExecutor, ASpareThatDiedWhileWaitingIsReplacedNotAHarnessError) {
  // Process 2 (the spare kept for attempt 1) exits at once; the rest serve,
  // crashing on [7,3].
  const std::string counter = ::testing::TempDir() + "/worker_counter_" + std::to_string(getpid());
  std::remove(counter.c_str());
  IsolationOptions o = ScriptedWorker(std::string("case \"$l\" in *\"[7,3]\"*) kill -SEGV $$;; *) ") + kPass + ";; esac", 0);
  o.spawn.args[1] = "n=$(cat " + counter + " 2>/dev/null || echo 0); n=$((n+1)); echo $n > " + counter +
                    "; [ $n = 2 ] && exit 7; " + o.spawn.args[1];
  o.policy.standby = true;
  IsolatedCaseExecutor e(o);
  ASSERT_TRUE(e.Start().ok());
  for (int i = 0; i < 100 && std::ifstream(counter).peek() != '2'; ++i) usleep(10000);  // the spare has started and died
  EXPECT_EQ(e.Run(testing::MulCase({7, 3})).outcome, Outcome::kCrash);
  EXPECT_EQ(e.Run(testing::MulCase({2, 3})).outcome, Outcome::kPass);
  EXPECT_TRUE(e.HarnessStatus().ok()) << e.HarnessStatus().ToString();
  std::remove(counter.c_str());
}

// Note [A memory ceiling]: a worker past its ceiling is killed by the
// parent, long before the machine runs out, and what it ran is skipped as
// over memory: not a crash, not rerun, not flaky.
TEST(IsolatedCaseExecutor, ACaseOverTheMemoryCeilingIsSkippedNotACrash) {
  IsolationOptions o =
      ScriptedWorker(R"sh(exec python3 -c "import time; x = b'1' * (400 << 20); time.sleep(30)")sh", 3);
  o.policy.unit_timeout_s = 20;
  o.spawn.memory_ceiling_bytes = int64_t{150} << 20;
  IsolatedCaseExecutor e(o);
  ASSERT_TRUE(e.Start().ok());
  const auto start = std::chrono::steady_clock::now();
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 15.0);
  EXPECT_EQ(r.outcome, Outcome::kSkipped) << r.error;
  EXPECT_NE(r.error.find("over memory: peak "), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("> ceiling 0.157 GB"), std::string::npos) << r.error;
  EXPECT_EQ(r.attempts, 1);
  EXPECT_FALSE(r.flaky);
  const auto detail = nlohmann::json::parse(r.detail_json);
  EXPECT_GT(detail["worker"]["peak_rss_bytes"].get<int64_t>(), int64_t{150} << 20);
}

TEST(IsolatedCaseExecutor, AHangIsATimeoutAndTheRunGoesOn) {
  IsolatedCaseExecutor e(ScriptedWorker(std::string("case \"$l\" in *\"[5,3]\"*) sleep 1000;; *) ") + kPass + ";; esac", 0));
  ASSERT_TRUE(e.Start().ok());
  CaseResult hung = e.Run(testing::MulCase({5, 3}));
  EXPECT_EQ(hung.outcome, Outcome::kTimeout);
  EXPECT_NE(hung.error.find("within 1 s"), std::string::npos) << hung.error;
  EXPECT_EQ(e.Run(testing::MulCase({2, 3})).outcome, Outcome::kPass);
  EXPECT_EQ(e.stats().timeouts, 1);
}

TEST(IsolatedCaseExecutor, AFailureThatPassesOnARerunIsFlaky) {
  // Fails only in the first worker (COVERAGE_ATTEMPT=1).
  IsolatedCaseExecutor e(ScriptedWorker(
      std::string("if [ \"$COVERAGE_ATTEMPT\" = 1 ]; then kill -SEGV $$; else ") + kPass + "; fi", 3));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kCrash);  // the first attempt's outcome
  EXPECT_EQ(r.attempts, 2);               // reruns stop at the first pass
  EXPECT_TRUE(r.flaky);
  EXPECT_EQ(r.attempt_outcomes, (std::vector<Outcome>{Outcome::kCrash, Outcome::kPass}));
}

TEST(IsolatedCaseExecutor, AConsistentCrashUsesEveryRerunEachInAFreshWorkerAndIsNotFlaky) {
  IsolatedCaseExecutor e(ScriptedWorker("kill -SEGV $$", 2));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kCrash);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_FALSE(r.flaky);
  EXPECT_EQ(r.attempt_outcomes, std::vector<Outcome>(3, Outcome::kCrash));
  EXPECT_EQ(e.stats().reruns, 2);
  EXPECT_EQ(e.stats().workers_started, 3);  // the first, then one fresh worker per rerun
}

// Note [Reruns]: a deterministic wrong answer is rerun in the same worker,
// with no process start.
TEST(IsolatedCaseExecutor, AWrongAnswerReproducedExactlyIsConsistentAfterOneRerunInTheSameWorker) {
  IsolatedCaseExecutor e(ScriptedWorker(kMismatch, 3));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kMismatch);
  EXPECT_EQ(r.error, "off by one");
  EXPECT_EQ(r.attempts, 2);
  EXPECT_FALSE(r.flaky);
  EXPECT_EQ(e.stats().reruns, 1);
  EXPECT_EQ(e.stats().same_worker_reruns, 1);
  EXPECT_EQ(e.stats().workers_started, 1) << "no fresh worker for a reproduced wrong answer";
}

// A rerun's op compute is the case's too.
TEST(IsolatedCaseExecutor, ARerunsTimeIsAddedToTheCase) {
  IsolatedCaseExecutor e(ScriptedWorker(
      R"(echo '{"result":{"outcome":"mismatch","error":"off","timing":{"backend_us":10,"total_us":30}}}' >&3)",
      3));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kMismatch);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_DOUBLE_EQ(r.timing.backend_us, 20);
  EXPECT_DOUBLE_EQ(r.timing.total_us, 60);
}

// A wrong answer that changes between calls escalates from the same-worker
// rerun to fresh workers and uses every rerun.
TEST(IsolatedCaseExecutor, AWrongAnswerThatChangesBetweenAttemptsUsesEveryRerun) {
  IsolatedCaseExecutor e(ScriptedWorker(
      R"(n=$((n+1)); printf '{"result":{"outcome":"mismatch","error":"off by %s.%s"}}\n' "$COVERAGE_ATTEMPT" "$n" >&3)",
      3));
  ASSERT_TRUE(e.Start().ok());
  CaseResult r = e.Run(testing::MulCase({2, 3}));
  EXPECT_EQ(r.outcome, Outcome::kMismatch);
  EXPECT_EQ(r.error, "off by 1.1");
  EXPECT_EQ(r.attempts, 4);
  EXPECT_FALSE(r.flaky);  // the same outcome every time
  EXPECT_EQ(e.stats().same_worker_reruns, 1);
  EXPECT_EQ(e.stats().workers_started, 3) << "the long-lived worker, then fresh ones for attempts 2 and 3";
}

TEST(IsolatedCaseExecutor, AWorkerThatCannotSetUpIsAHarnessError) {
  IsolationOptions o;
  o.spawn.executable = "/bin/sh";
  o.spawn.args = {"-c", "read -r s <&3; echo '{\"error\":\"unknown backend nope\"}' >&3"};
  o.setup.backend = "nope";
  IsolatedCaseExecutor e(o);
  Status s = e.Start();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("unknown backend nope"), std::string::npos) << s.ToString();
}

TEST(IsolatedCaseExecutor, AnUnreadableReplyIsAHarnessErrorNotACaseOutcome) {
  IsolatedCaseExecutor e(ScriptedWorker("echo 'not json' >&3", 0));
  ASSERT_TRUE(e.Start().ok());
  e.Run(testing::MulCase({2, 3}));
  EXPECT_FALSE(e.HarnessStatus().ok());
  EXPECT_NE(e.HarnessStatus().message().find("not json"), std::string::npos);
}

TEST(IsolationPolicy, ParsesTheShippedConfigAndOverridesPerOp) {
  auto p = IsolationPolicy::FromJson(
      R"({"timeout_s": 30, "op_timeout_s": {"aten::mm": 90, "aten::add.Tensor": 5}, "reruns": 2,
          "stage_timeout_s": {"train": 100}})",
      "isolation.json", {"module", "model", "train"});
  ASSERT_TRUE(p.has_value()) << p.error().ToString();
  EXPECT_EQ(p->TimeoutFor(testing::MmCase(2, 2, 2)), 90);
  EXPECT_EQ(p->TimeoutFor(testing::MulCase({2})), 30);
  EXPECT_EQ(p->TimeoutForStage("train"), 100);
  EXPECT_EQ(p->TimeoutForStage("model"), 900);
  EXPECT_EQ(p->reruns, 2);
}

TEST(IsolationPolicy, BadValuesNameTheFileAndKey) {
  for (const auto& [text, expected] : std::vector<std::pair<std::string, std::string>>{
           {R"({"timeout_s": -1})", "'timeout_s'"},
           {R"({"reruns": 1.5})", "'reruns'"},
           {R"({"op_timeout_s": {"mm": 3}})", "'mm'"},
           {R"({"stage_timeout_s": {"unit": 3}})", "'unit'"},
           {R"({"timeouts": 3})", "unknown key 'timeouts'"},
           {R"({"memory_ceiling_gb": -1})", "'memory_ceiling_gb'"},
           {R"({"memory_ceiling_gb": "lots"})", "'memory_ceiling_gb'"},
           {R"({"memory_ceiling_gb": 1e300})", "'memory_ceiling_gb'"},
           {"[", "not a JSON object"}}) {
    auto p = IsolationPolicy::FromJson(text, "conf/iso.json", {"module", "model", "train"});
    ASSERT_FALSE(p.has_value()) << text;
    EXPECT_NE(p.error().message().find("conf/iso.json"), std::string::npos) << p.error().ToString();
    EXPECT_NE(p.error().message().find(expected), std::string::npos) << p.error().ToString();
  }
}

// Note [A memory ceiling]: "auto" is the machine less its reserve, a number
// is GB, 0 is none.
TEST(IsolationPolicy, TheMemoryCeilingIsAutoANumberOrNone) {
  auto automatic = IsolationPolicy::FromJson(R"({"memory_ceiling_gb": "auto"})", "iso.json", {});
  ASSERT_TRUE(automatic.has_value()) << automatic.error().ToString();
  EXPECT_EQ(automatic->MemoryCeilingBytes(), DefaultMemoryCeilingBytes());
  const double machine = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  EXPECT_GT(DefaultMemoryCeilingBytes(), 0);
  EXPECT_LT(static_cast<double>(DefaultMemoryCeilingBytes()), machine);  // a reserve is always left
  auto fixed = IsolationPolicy::FromJson(R"({"memory_ceiling_gb": 12.5})", "iso.json", {});
  ASSERT_TRUE(fixed.has_value());
  EXPECT_EQ(fixed->MemoryCeilingBytes(), int64_t{12'500'000'000});
  auto none = IsolationPolicy::FromJson(R"({"memory_ceiling_gb": 0})", "iso.json", {});
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->MemoryCeilingBytes(), 0);
}

TEST(WorkerSetup, RoundTripsThroughJson) {
  WorkerSetup s;
  s.backend = "sim";
  s.tolerances_json = R"({"default_multiplier": 4})";
  s.warm_iterations = 7;
  s.golden = GoldenMode::kAlways;
  s.seed = 42;
  s.checks.train_steps = 5;
  s.checks.min_cosine = 0.9;
  auto back = WorkerSetup::FromJson(s.ToJson());
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->backend, "sim");
  EXPECT_EQ(back->warm_iterations, 7);
  EXPECT_EQ(back->golden, GoldenMode::kAlways);
  EXPECT_EQ(back->seed, 42u);
  EXPECT_EQ(back->checks.train_steps, 5);
  EXPECT_EQ(back->checks.min_cosine, 0.9);
  EXPECT_EQ(back->checks.comparison.default_multiplier, 4);
}

}  // namespace
}  // namespace coverage::isolation

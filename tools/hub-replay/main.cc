// hub-replay: serves the Hugging Face Hub API subset the crawler uses, from
// the real recorded data or a synthetic hub, with optional faults and quota.
// Runs until SIGINT or SIGTERM. Exit codes: 0 stopped by a signal, 2 bad
// flags or data.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include "tools/hub-replay/hub_server.h"

namespace {
constexpr int kExitUsage = 2;
}

int main(int argc, char** argv) {
  using coverage::hub_replay::HubOptions;
  using coverage::hub_replay::HubServer;
  CLI::App app{
      "hub-replay: a local Hugging Face Hub API server (GET /api/models, /api/models/{id},\n"
      "/{id}/resolve/main/config.json) serving the real recorded data in data/hub/ or a synthetic\n"
      "hub of any size, with optional injected faults and a request quota. Point a client at it\n"
      "with HF_ENDPOINT=<the printed URL>."};
  HubOptions options;
  options.data_dir = COVERAGE_SOURCE_DIR "/data/hub";
  std::string host = "127.0.0.1";
  int port = 0;
  app.add_option("--host", host, "Address to listen on")->capture_default_str();
  app.add_option("--port", port, "Port (0 = any free port)")->capture_default_str()->check(CLI::Range(0, 65535));
  app.add_option("--data", options.data_dir, "Folder with configs.jsonl, models.jsonl and redirects.json")
      ->capture_default_str()
      ->check(CLI::ExistingDirectory);
  app.add_option("--synthetic", options.synthetic, "Serve a synthetic hub of N models instead of the real data")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--seed", options.seed, "Seed of the synthetic hub")->capture_default_str();
  app.add_option("--fault-rate", options.faults.rate, "Probability that a request gets an injected fault")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--faults", options.faults.kinds,
                 "Fault kinds to draw from, comma-separated: 429,500,502,503,reset,truncate,malformed,slow")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--fault-seed", options.faults.seed, "Seed of the fault sequence")->capture_default_str();
  app.add_option("--max-faults-in-a-row", options.faults.max_in_a_row,
                 "Answer a URL normally after this many faulted requests for it in a row (0 = no cap)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--slow-ms", options.faults.slow_ms, "Delay of a 'slow' fault in milliseconds")
      ->capture_default_str()
      ->check(CLI::Range(0, 600000));
  app.add_option("--quota", options.quota.requests, "Requests allowed per bucket and window (0 = no quota)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--quota-window", options.quota.window_s, "Quota window in seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-page", options.max_page, "Largest page a list request gets (caps limit)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--gated-token", options.gated_token, "Token that unlocks gated configs (Authorization: Bearer)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }

  // Signals are taken by sigwait below; block them before any server thread
  // starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  try {
    auto server = HubServer::Start(options, host, port);
    if (!server) {
      std::fprintf(stderr, "hub-replay: %s\n", server.error().ToString().c_str());
      return kExitUsage;
    }
    std::printf("hub-replay: serving %lld models on %s\n", static_cast<long long>((*server)->model_count()),
                (*server)->endpoint().c_str());
    std::fflush(stdout);
    int signal = 0;
    sigwait(&signals, &signal);
    (*server)->Stop();
    const auto stats = (*server)->stats();
    std::fprintf(stderr, "hub-replay: stopped after %lld requests (%lld faults, %lld over quota)\n",
                 static_cast<long long>(stats.requests), static_cast<long long>(stats.faults),
                 static_cast<long long>(stats.quota_rejections));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hub-replay: internal error: %s\n", e.what());
    return kExitUsage;
  }
  return 0;
}

// `coverage crawl`: lists Hub models (and fetches their config.json) into the registry.
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/app.h"
#include "apps/flags.h"
#include "core/progress.h"
#include "crawler/agent.h"
#include "crawler/curl_http_client.h"
#include "registry/registry.h"
#include "selection/features.h"
#include "selection/signature.h"
#include "crawler/registry_sink.h"

namespace coverage::apps {
namespace {

struct CrawlFlags {
  std::string endpoint;
  std::vector<std::string> query;
  std::string search, author, sort, pipeline_tag, library;
  std::vector<std::string> filters;
  int64_t max_models = 0;
  std::string configs = "all";
  int concurrency = 4;
  double rate = 10;
  int page_limit = 1000;
  bool resume = false;
  std::vector<std::string> models;
  bool agent = false;
  int64_t budget = 10000;
  uint64_t seed = 1;
  double min_gain = 0.0001;
  std::string trace;
  bool explain = false;
  std::string defaults;
};

std::string TracePath(const GlobalOptions& global, const CrawlFlags& flags) {
  if (!flags.trace.empty()) return flags.trace;
  std::string base = global.registry_path;
  if (base.size() > 3 && base.compare(base.size() - 3, 3, ".db") == 0) base.resize(base.size() - 3);
  return base + ".agent.jsonl";
}

int RunAgentCommand(const GlobalOptions& global, const CrawlFlags& flags, crawler::CrawlOptions transport) {
  const std::string defaults_path =
      flags.defaults.empty() ? global.home + "/data/transformers_defaults.jsonl" : flags.defaults;
  auto defaults = selection::FamilyDefaults::Load(defaults_path);
  if (!defaults) return ReportError(defaults.error().WithContext("--defaults"));
  auto reg = OpenRegistry(global, /*read_only=*/false, /*create=*/true);
  if (!reg) return ReportError(reg.error());
  crawler::RegistryCrawlSink sink(reg->get());
  crawler::AgentOptions options;
  options.transport = std::move(transport);
  options.budget = flags.budget;
  options.seed = flags.seed;
  options.min_gain = flags.min_gain;
  options.trace_path = TracePath(global, flags);
  options.resume = flags.resume;
  Progress progress("agent", flags.budget, !global.quiet);
  options.on_progress = [&](int64_t requests, int64_t fine) {
    progress.Update(requests, fmt::format("{} fine signatures", fine));
  };
  const selection::FamilyDefaults& table = **defaults;
  crawler::Classifier classify = [&table](std::string_view config) -> std::optional<std::string> {
    auto f = selection::ExtractFeatures(config, table);
    if (!f) return std::nullopt;
    return selection::FineSignature(*f);
  };
  crawler::CurlOptions curl;
  auto make_client = [&]() -> std::unique_ptr<crawler::HttpClient> {
    return std::make_unique<crawler::CurlHttpClient>(curl);
  };
  std::printf("crawl agent on %s: budget %lld requests (trace %s)\n", options.transport.endpoint.c_str(),
              static_cast<long long>(options.budget), options.trace_path.c_str());
  auto summary = crawler::RunAgent(options, sink, make_client, classify);
  progress.Finish();
  if (!summary) return ReportError(summary.error().WithContext("crawl agent"));
  const auto& s = *summary;
  std::printf("agent: %lld of %lld requests used (%lld list pages, %lld config fetches this run)\n",
              static_cast<long long>(s.requests), static_cast<long long>(options.budget),
              static_cast<long long>(s.pages), static_cast<long long>(s.configs_fetched));
  std::printf("  %lld fine signatures found in %lld regions (%lld saturated)\n",
              static_cast<long long>(s.fine_signatures), static_cast<long long>(s.regions),
              static_cast<long long>(s.saturated_regions));
  std::printf("  stopped: %s\n", s.stopped_because.c_str());
  std::printf("registry: %s; why it did what it did: coverage crawl --explain\n", global.registry_path.c_str());
  if (s.interrupted) {
    std::printf("interrupted: rerun with --agent --resume to continue\n");
    return kExitInterrupted;
  }
  return kExitOk;
}

int RunCrawlCommand(const GlobalOptions& global, const CrawlFlags& flags) {
  if (flags.explain) {
    auto text = crawler::ExplainTrace(TracePath(global, flags));
    if (!text) return ReportError(text.error());
    std::printf("%s", text->c_str());
    return kExitOk;
  }
  crawler::CrawlOptions options;
  options.endpoint = flags.endpoint;
  if (options.endpoint.empty()) {
    const char* env = std::getenv("HF_ENDPOINT");
    options.endpoint = env && *env ? env : "https://huggingface.co";
  }
  while (!options.endpoint.empty() && options.endpoint.back() == '/') options.endpoint.pop_back();
  if (const char* token = std::getenv("HF_TOKEN"); token && *token) options.token = token;
  for (const auto& kv : flags.query) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      return ReportError(Status::InvalidArgument("--query '" + kv + "': expected KEY=VALUE, e.g. filter=llama"));
    }
    options.query.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  auto add = [&](const char* key, const std::string& value) {
    if (!value.empty()) options.query.emplace_back(key, value);
  };
  add("search", flags.search);
  add("author", flags.author);
  add("pipeline_tag", flags.pipeline_tag);
  add("library", flags.library);
  for (const auto& f : flags.filters) add("filter", f);
  add("sort", flags.sort);
  options.max_models = flags.max_models;
  options.fetch_configs = flags.configs == "all";
  options.concurrency = flags.concurrency;
  options.rate_per_s = flags.rate;
  options.page_limit = flags.page_limit;
  options.resume = flags.resume;
  options.model_ids = flags.models;
  if (!flags.models.empty() && flags.resume) {
    return ReportError(Status::InvalidArgument("--resume continues a listing; it does not go with --model"));
  }
  options.stop = InstallStopHandler();
  if (flags.agent) {
    if (!flags.models.empty() || !options.query.empty() || flags.max_models > 0) {
      return ReportError(Status::InvalidArgument(
          "--agent chooses its own queries; it does not go with --model, --query, --search, --filter or --max-models"));
    }
    return RunAgentCommand(global, flags, options);
  }

  auto reg = OpenRegistry(global, /*read_only=*/false, /*create=*/true);
  if (!reg) return ReportError(reg.error());
  crawler::RegistryCrawlSink sink(reg->get());
  Progress progress("crawl", 0, !global.quiet);
  options.on_progress = [&](const crawler::CrawlProgress& p) {
    progress.Update(0, p.configs_total > 0 ? fmt::format("{} pages, {} models, configs {}/{}", p.pages, p.models,
                                                         p.configs_done, p.configs_total)
                                           : fmt::format("{} pages, {} models", p.pages, p.models));
  };
  crawler::CurlOptions curl;
  auto make_client = [&]() -> std::unique_ptr<crawler::HttpClient> {
    return std::make_unique<crawler::CurlHttpClient>(curl);
  };
  std::printf("crawl %s (%s)\n", crawler::FirstPageUrl(options).c_str(),
              options.token.empty() ? "anonymous" : "with the token in $HF_TOKEN");
  auto summary = crawler::RunCrawl(options, sink, make_client);
  progress.Finish();
  if (!summary) return ReportError(summary.error().WithContext("crawl"));
  const auto& s = *summary;
  std::printf("crawl: %lld pages, %lld models stored, %lld entries rejected\n", static_cast<long long>(s.pages),
              static_cast<long long>(s.models), static_cast<long long>(s.rejects));
  if (options.fetch_configs) {
    std::printf("  configs: %lld fetched, %lld missing, %lld gated, %lld invalid, %lld failed (retried next crawl)\n",
                static_cast<long long>(s.configs_fetched), static_cast<long long>(s.configs_missing),
                static_cast<long long>(s.configs_gated), static_cast<long long>(s.configs_invalid),
                static_cast<long long>(s.config_errors));
  }
  std::printf("  %lld requests, %lld retries, %.1fs waiting; %.1fs in all\n", static_cast<long long>(s.requests),
              static_cast<long long>(s.retries), s.waited_s, s.seconds);
  for (const auto& e : s.errors) std::printf("  failed: %s\n", e.c_str());
  std::printf("registry: %s\n", global.registry_path.c_str());
  if (s.interrupted) {
    std::printf(options.model_ids.empty() ? "interrupted: rerun with --resume to continue\n"
                                          : "interrupted: rerun the same command to finish\n");
    return kExitInterrupted;
  }
  return kExitOk;
}

}  // namespace

void AddCrawlCommand(CLI::App& app, GlobalOptions& global) {
  auto flags = std::make_shared<CrawlFlags>();
  CLI::App* cmd = app.add_subcommand(
      "crawl",
      "List models from the Hugging Face Hub API (or a local hub-replay) into the registry, then fetch the\n"
      "config.json of those that lack one. $HF_ENDPOINT picks the server, $HF_TOKEN is sent as a Bearer token.");
  cmd->add_option("--endpoint", flags->endpoint, "Hub URL [default: $HF_ENDPOINT or https://huggingface.co]");
  cmd->add_option("--search", flags->search, "Substring of the model id");
  cmd->add_option("--author", flags->author, "User or organisation");
  cmd->add_option("--filter", flags->filters, "Tag filter, e.g. llama, text-generation (repeatable)");
  cmd->add_option("--pipeline-tag", flags->pipeline_tag, "e.g. text-generation");
  cmd->add_option("--library", flags->library, "e.g. transformers");
  cmd->add_option("--sort", flags->sort, "downloads, likes, createdAt, lastModified");
  cmd->add_option("--query", flags->query, "Any other list parameter as KEY=VALUE (repeatable)");
  cmd->add_option("--max-models", flags->max_models,
                  "Stop after the page that reaches this many models (0 = all; pages are stored whole)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 50));
  cmd->add_option("--configs", flags->configs, "Fetch config.json of listed models")
      ->capture_default_str()
      ->check(CLI::IsMember({"all", "none"}));
  cmd->add_option("--concurrency", flags->concurrency, "Parallel config fetches")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--rate", flags->rate, "Requests per second, all together (0 = no limit)")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1e6) & CLI::Validator(
                                         [](std::string& v) {
                                           const double r = std::strtod(v.c_str(), nullptr);
                                           return r == 0 || r >= 0.001 ? std::string()
                                                                       : std::string("--rate must be 0 or at least 0.001");
                                         },
                                         "0 or >= 0.001"));
  cmd->add_option("--page-limit", flags->page_limit, "Models per list page")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_flag("--resume", flags->resume, "Continue the same crawl (or agent run) where it stopped");
  cmd->add_option("--model", flags->models,
                  "Fetch only these models (GET /api/models/{id}, following renames) instead of listing (repeatable)");
  cmd->add_flag("--agent", flags->agent,
                "Let the crawl agent decide what to list and which configs to fetch, within --budget requests");
  cmd->add_option("--budget", flags->budget, "Agent: requests in all, retries included, across --resume runs")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--seed", flags->seed, "Agent: seed of its random picks within a region")->capture_default_str()
      ->check(SeedCheck());
  cmd->add_option("--min-gain", flags->min_gain,
                  "Agent: stop when no action is expected to reveal this many new fine signatures per request")
      ->capture_default_str()
      ->check(FiniteRange(0.0, 1000.0));
  cmd->add_option("--trace", flags->trace, "Agent: JSONL trace of its decisions [default: REGISTRY minus .db + .agent.jsonl]");
  cmd->add_option("--defaults", flags->defaults,
                  "Agent: family defaults for reading configs [default: HOME/data/transformers_defaults.jsonl]");
  cmd->add_flag("--explain", flags->explain, "Summarise the agent's trace (what it did and why) and exit");
  cmd->callback([&global, flags]() { global.exit_code = RunCrawlCommand(global, *flags); });
}

}  // namespace coverage::apps

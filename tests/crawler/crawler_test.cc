#include <string>

#include <gtest/gtest.h>

#include "crawler/http_client.h"
#include "crawler/hub_model.h"
#include "crawler/link_header.h"
#include "crawler/model_id.h"
#include "crawler/retry.h"

namespace coverage::crawler {
namespace {

TEST(ModelId, AcceptsRealHubIds) {
  for (const char* id : {"bert-base-uncased", "google-bert/bert-base-uncased", "Qwen/Qwen3-0.6B",
                         "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "meta-llama/Llama-3_3-Nemotron-Super-49B-v1",
                         "sentence-transformers/all-MiniLM-L6-v2", "_private/x", "a"}) {
    EXPECT_TRUE(ValidateModelId(id).ok()) << id << ": " << ValidateModelId(id).message();
  }
  EXPECT_TRUE(ValidateModelId(std::string(96, 'a')).ok());
}

TEST(ModelId, RejectsWhatTheHubRejectsAndSaysWhy) {
  struct Bad {
    std::string id;
    const char* why;
  };
  const Bad bad[] = {
      {"", "empty"},
      {"a/b/c", "more than one '/'"},
      {"org/a..b", "'..'"},
      {"../etc", "'..'"},
      {"org/a--b", "'--'"},
      {"org/model.git", "'.git'"},
      {"org/-model", "start and end"},
      {"org/model.", "start and end"},
      {"/model", "empty namespace"},
      {"org/", "empty name"},
      {"org/mod el", "letters, digits"},
      {"org/mod%2Fel", "letters, digits"},
      {"org/model?x=1", "letters, digits"},
      {"org/caf\xc3\xa9", "letters, digits"},
      {std::string(97, 'a'), "more than 96"},
  };
  for (const auto& b : bad) {
    Status s = ValidateModelId(b.id);
    ASSERT_FALSE(s.ok()) << b.id;
    EXPECT_NE(s.message().find(b.why), std::string::npos) << b.id << ": " << s.message();
  }
  // A hostile id is shown printable and short in the error.
  Status s = ValidateModelId(std::string(1000, 'x') + "\n");
  EXPECT_LT(s.message().size(), 250u);
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(LinkHeader, FindsTheNextPageAsTheHubSendsIt) {
  // The shape a Hub maintainer gave in huggingface_hub PR #1176.
  const std::string header =
      "<http://localhost:5564/api/models?limit=10&sort=likes&direction=-1&cursor=eyIkb3IiOlt7ImxpA%3D>; rel=\"next\"";
  EXPECT_EQ(NextPageUrl(header),
            "http://localhost:5564/api/models?limit=10&sort=likes&direction=-1&cursor=eyIkb3IiOlt7ImxpA%3D");
  EXPECT_FALSE(NextPageUrl("").has_value());
}

TEST(LinkHeader, HandlesSeveralLinksParametersAndJunk) {
  auto links = ParseLinkHeader(
      "<https://h/a?x=1,2>; rel=\"prev\", <https://h/b>; title=\"a; b, c\"; REL=\"next last\" ,"
      " <ftp://h/c>; rel=\"first\", garbage, <https://h/d>");
  EXPECT_EQ(links["prev"], "https://h/a?x=1,2");
  EXPECT_EQ(links["next"], "https://h/b");
  EXPECT_EQ(links["last"], "https://h/b");
  EXPECT_EQ(links.count("first"), 0u);  // not http(s)
  EXPECT_EQ(links.size(), 3u);
  EXPECT_EQ(NextPageUrl("<https://h/n>; rel=next"), "https://h/n");  // unquoted
  EXPECT_FALSE(NextPageUrl("<https://h/n; rel=\"next\"").has_value());  // unterminated
}

TEST(Retry, RetriesTheStatusesTheHubClientRetries) {
  for (int s : {408, 429, 500, 502, 503, 504}) EXPECT_TRUE(IsRetryableStatus(s)) << s;
  for (int s : {200, 301, 307, 400, 401, 403, 404, 501}) EXPECT_FALSE(IsRetryableStatus(s)) << s;
}

TEST(Retry, BackoffDoublesFromOneToEightSecondsWithBoundedJitter) {
  RetryPolicy p;
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 1, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 2, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 3, 0.5), 4.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 4, 0.5), 8.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 9, 0.5), 8.0);
  EXPECT_DOUBLE_EQ(BackoffSeconds(p, 2, 0.0), 1.5);
  EXPECT_LT(BackoffSeconds(p, 2, 0.999), 2.5);
}

TEST(Retry, ParsesTheHubsRateLimitHeader) {
  auto rl = ParseRateLimit("\"api\";r=0;t=55");
  ASSERT_TRUE(rl.has_value());
  EXPECT_EQ(rl->bucket, "api");
  EXPECT_EQ(rl->remaining, 0);
  EXPECT_EQ(rl->reset_s, 55);
  auto spaced = ParseRateLimit(" \"resolvers\" ; t = 10 ; r = 42 ");
  ASSERT_TRUE(spaced.has_value());
  EXPECT_EQ(spaced->remaining, 42);
  EXPECT_EQ(spaced->reset_s, 10);
  for (const char* bad : {"", "\"api\";r=0", "\"api\";r=-1;t=5", "\"api\";r=x;t=5", "\"api;r=0;t=5"}) {
    EXPECT_FALSE(ParseRateLimit(bad).has_value()) << bad;
  }
}

TEST(Retry, ParsesRetryAfterAsSecondsOrDate) {
  const std::time_t now = 784111777;  // Sun, 06 Nov 1994 08:49:37 GMT
  EXPECT_EQ(ParseRetryAfter("120", now), 120.0);
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:50:37 GMT", now), 60.0);
  EXPECT_EQ(ParseRetryAfter("Sun, 06 Nov 1994 08:00:00 GMT", now), 0.0);  // in the past
  for (const char* bad : {"", "-5", "soon", "12 seconds", "Sun, 06 Nov 1994"}) {
    EXPECT_FALSE(ParseRetryAfter(bad, now).has_value()) << bad;
  }
}

TEST(Retry, ServerHintsWinOverBackoffButAreCapped) {
  RetryPolicy p;
  // Quota spent: wait for the window to reset, plus one second.
  EXPECT_DOUBLE_EQ(WaitBeforeRetry(p, 1, RateLimit{"api", 0, 55}, std::nullopt, 0.5), 56.0);
  // Quota left: Retry-After decides.
  EXPECT_DOUBLE_EQ(WaitBeforeRetry(p, 1, RateLimit{"api", 3, 55}, 7.0, 0.5), 7.0);
  EXPECT_DOUBLE_EQ(WaitBeforeRetry(p, 3, std::nullopt, std::nullopt, 0.5), 4.0);
  // A server asking for a day gets the cap.
  EXPECT_DOUBLE_EQ(WaitBeforeRetry(p, 1, std::nullopt, 86400.0, 0.5), 300.0);
  EXPECT_DOUBLE_EQ(WaitBeforeRetry(p, 1, RateLimit{"api", 0, 999999}, std::nullopt, 0.5), 300.0);
}

TEST(HttpResponse, HeaderLookupIgnoresCase) {
  HttpResponse r;
  r.headers.emplace("link", "<https://h/n>; rel=\"next\"");
  EXPECT_EQ(r.Header("Link"), "<https://h/n>; rel=\"next\"");
  EXPECT_EQ(r.Header("Retry-After"), "");
}

}  // namespace
}  // namespace coverage::crawler

namespace coverage::crawler {
namespace {

// Fields as the Hub sends them (a recorded /api/models/google-bert/bert-base-uncased
// body, trimmed; shared/data/hub/api_samples).
constexpr const char* kBertEntry = R"({
  "_id": "621ffdc036468d709f174338", "id": "google-bert/bert-base-uncased",
  "modelId": "google-bert/bert-base-uncased", "author": "google-bert",
  "sha": "86b5e0934494bd15c9632b12f734a8a67f723594", "private": false, "gated": false,
  "disabled": false, "downloads": 54412386, "likes": 2238,
  "tags": ["transformers", "pytorch", "bert", "fill-mask", "en"], "pipeline_tag": "fill-mask",
  "library_name": "transformers", "createdAt": "2022-03-02T23:29:04.000Z",
  "lastModified": "2024-02-19T11:06:12.000Z",
  "config": {"architectures": ["BertForMaskedLM"], "model_type": "bert", "tokenizer_config": {}}
})";

TEST(HubModel, ParsesARealEntry) {
  auto j = ParseJsonCapped(kBertEntry);
  ASSERT_TRUE(j.has_value()) << j.error().ToString();
  auto m = ParseHubModel(*j);
  ASSERT_TRUE(m.has_value()) << m.error().ToString();
  EXPECT_EQ(m->id, "google-bert/bert-base-uncased");
  EXPECT_EQ(m->author, "google-bert");
  EXPECT_EQ(m->downloads, 54412386);
  EXPECT_EQ(m->likes, 2238);
  EXPECT_EQ(m->tags.size(), 5u);
  EXPECT_EQ(m->model_type, "bert");
  EXPECT_EQ(m->architectures, std::vector<std::string>{"BertForMaskedLM"});
  EXPECT_EQ(m->gated, "false");
  EXPECT_EQ(m->created_at, "2022-03-02T23:29:04.000Z");
}

TEST(HubModel, MinimalEntriesGetTheirAuthorFromTheId) {
  auto m = ParseHubModel(nlohmann::json{{"id", "Qwen/Qwen3-0.6B"}, {"gated", "manual"}, {"downloads", nullptr}});
  ASSERT_TRUE(m.has_value()) << m.error().ToString();
  EXPECT_EQ(m->author, "Qwen");
  EXPECT_EQ(m->gated, "manual");
  EXPECT_EQ(m->downloads, 0);
}

TEST(HubModel, HostileEntriesAreClearPerModelErrors) {
  struct Bad {
    nlohmann::json entry;
    const char* why;
  };
  const Bad bad[] = {
      {nlohmann::json::array(), "not a JSON object"},
      {{{"likes", 3}}, "no string 'id'"},
      {{{"id", 42}}, "no string 'id'"},
      {{{"id", "../../etc/passwd"}}, "model id"},
      {{{"id", "org/m"}, {"downloads", "many"}}, "'downloads' must be an integer"},
      {{{"id", "org/m"}, {"downloads", -1}}, "'downloads' is negative"},
      {{{"id", "org/m"}, {"tags", "bert"}}, "'tags' must be an array"},
      {{{"id", "org/m"}, {"tags", {1, 2}}}, "'tags' must hold only strings"},
      {{{"id", "org/m"}, {"gated", "sometimes"}}, "'gated'"},
      {{{"id", "org/m"}, {"config", "bert"}}, "'config' must be an object"},
      {{{"id", "org/m"}, {"config", {{"model_type", 7}}}}, "config: field 'model_type'"},
  };
  for (const auto& b : bad) {
    auto m = ParseHubModel(b.entry);
    ASSERT_FALSE(m.has_value()) << b.entry.dump();
    EXPECT_NE(m.error().message().find(b.why), std::string::npos) << m.error().message();
  }
}

TEST(HubModel, DeepOrBrokenJsonIsRefused) {
  std::string deep(200, '[');
  deep += std::string(200, ']');
  auto d = ParseJsonCapped(deep);
  ASSERT_FALSE(d.has_value());
  EXPECT_NE(d.error().message().find("deeper than 64"), std::string::npos);
  EXPECT_EQ(d.error().code(), StatusCode::kUnsupported);  // the document, not its transfer
  EXPECT_TRUE(ParseJsonCapped(std::string(60, '[') + std::string(60, ']')).has_value());
  for (const char* bad : {"", "<html>rate limited</html>", "[{\"id\": ", "{\"id\": \"a\"} trailing"}) {
    EXPECT_FALSE(ParseJsonCapped(bad).has_value()) << bad;
  }
}

TEST(HubModel, PythonNonFiniteLiteralsParseAsNullOnlyWhenAsked) {
  // As in real config.json files written by Python's json module.
  const std::string body = R"({"time_step_limit": [0.0, Infinity], "a": -Infinity, "b": NaN, "s": "NaN Infinity"})";
  EXPECT_FALSE(ParseJsonCapped(body).has_value());
  auto j = ParseJsonCapped(body, {.python_literals = true});
  ASSERT_TRUE(j.has_value()) << j.error().ToString();
  EXPECT_TRUE((*j)["time_step_limit"][1].is_null());
  EXPECT_TRUE((*j)["a"].is_null());
  EXPECT_TRUE((*j)["b"].is_null());
  EXPECT_EQ((*j)["s"], "NaN Infinity");  // strings are left alone
  EXPECT_FALSE(ParseJsonCapped("{\"a\": Infinit}", {.python_literals = true}).has_value());
  EXPECT_FALSE(ParseJsonCapped("{\"a\": -5, \"b\": Nope}", {.python_literals = true}).has_value());
}

}  // namespace
}  // namespace coverage::crawler

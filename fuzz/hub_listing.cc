// Fuzz target: the Hub listing and model-entry parser. The input is the
// body a Hub server sends: fetched as a listing page (FetchPage,
// crawler/fetcher.h: depth-capped JSON that must be an array) whose entries
// go through ParseHubModel (crawler/hub_model.h) as the crawl does, and,
// when it is an object, as the entry of `GET /api/models/{id}`.
// Invariants: bad input is an error value; an accepted entry has a valid id,
// counts >= 0 and a known `gated`; written back in the wire format it parses
// to the same model.
#include "crawler/fetcher.h"
#include "crawler/hub_model.h"
#include "crawler/model_id.h"
#include "fuzz/fuzz_check.h"

namespace {

using namespace coverage;
using namespace coverage::crawler;

// Serves the fuzz input as a 200 for every request.
class BodyClient final : public HttpClient {
 public:
  std::string_view body;
  Result<HttpResponse> Get(const HttpRequest& request) override {
    HttpResponse r;
    r.status = 200;
    r.body = std::string(body);
    r.final_url = request.url;
    return r;
  }
};

nlohmann::json ToWire(const HubModel& m) {
  nlohmann::json j = {{"id", m.id},
                      {"author", m.author},
                      {"sha", m.sha},
                      {"downloads", m.downloads},
                      {"likes", m.likes},
                      {"tags", m.tags},
                      {"pipeline_tag", m.pipeline_tag},
                      {"library_name", m.library_name},
                      {"createdAt", m.created_at},
                      {"lastModified", m.last_modified},
                      {"private", m.is_private},
                      {"config", {{"model_type", m.model_type}, {"architectures", m.architectures}}}};
  if (m.gated == "true" || m.gated == "false") {
    j["gated"] = m.gated == "true";
  } else {
    j["gated"] = m.gated;
  }
  return j;
}

void CheckEntry(const nlohmann::json& entry) {
  auto m = ParseHubModel(entry);
  if (!m) {
    FUZZ_CHECK(m.error().code() == StatusCode::kInvalidArgument, m.error().ToString());
    return;
  }
  FUZZ_CHECK(ValidateModelId(m->id).ok(), m->id);
  FUZZ_CHECK(m->downloads >= 0 && m->likes >= 0, m->id);
  FUZZ_CHECK(m->gated == "false" || m->gated == "true" || m->gated == "auto" || m->gated == "manual", m->gated);
  const nlohmann::json wire = ToWire(*m);
  auto again = ParseHubModel(wire);
  FUZZ_CHECK(again.has_value(), again.error().ToString() + " for " + fuzz::Dump(wire));
  FUZZ_CHECK(fuzz::Dump(ToWire(*again)) == fuzz::Dump(wire), fuzz::Dump(wire));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const CrawlOptions options = [] {
    CrawlOptions o;
    o.endpoint = "http://hub.test";
    o.rate_per_s = 0;      // no pacing
    o.retry.max_tries = 1;  // a body that is not an array fails at once
    o.wait_scale = 0;
    return o;
  }();
  static detail::Fetcher fetcher(options);
  BodyClient client;
  client.body = fuzz::AsText(data, size);

  auto page = detail::FetchPage(options, client, fetcher, "http://hub.test/api/models?limit=100");
  if (page) {
    FUZZ_CHECK(!page->aborted && page->body.is_array(), "FetchPage returned a page that is not an array");
    for (const auto& entry : page->body) CheckEntry(entry);
  } else {
    FUZZ_CHECK(page.error().code() == StatusCode::kIoError, page.error().ToString());
  }
  // The single-model endpoint's body.
  if (auto body = ParseJsonCapped(client.body); body && body->is_object()) CheckEntry(*body);
  return 0;
}

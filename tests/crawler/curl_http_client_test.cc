// The libcurl client against a real HTTP server on 127.0.0.1 (cpp-httplib).
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <httplib.h>

#include "crawler/curl_http_client.h"

namespace coverage::crawler {
namespace {

class LocalServer {
 public:
  LocalServer() {
    server_.Get("/ok", [this](const httplib::Request& req, httplib::Response& res) {
      ++hits;
      res.set_header("Link", "<http://127.0.0.1/api/models?cursor=abc>; rel=\"next\"");
      const bool authed = req.get_header_value("Authorization") == "Bearer hf_secret_token";
      res.set_content(std::string("{\"authed\":") + (authed ? "true" : "false") + "}", "application/json");
    });
    // A renamed id, as the Hub answers it: a relative 307.
    server_.Get("/api/models/bert-base-uncased", [](const httplib::Request&, httplib::Response& res) {
      res.status = 307;
      res.set_header("X-From-Redirect", "1");
      res.set_header("Location", "/api/models/google-bert/bert-base-uncased");
    });
    server_.Get("/api/models/google-bert/bert-base-uncased", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"id\":\"google-bert/bert-base-uncased\"}", "application/json");
    });
    // A redirect to wherever ?to= says (another port: another origin).
    server_.Get("/away", [](const httplib::Request& req, httplib::Response& res) {
      res.status = 302;
      res.set_header("Location", req.get_param_value("to"));
    });
    server_.Get("/loop", [](const httplib::Request&, httplib::Response& res) {
      res.status = 307;
      res.set_header("Location", "/loop");
    });
    server_.Get("/missing", [](const httplib::Request&, httplib::Response& res) {
      res.status = 404;
      res.set_header("X-Error-Code", "RepoNotFound");
      res.set_content("Repository not found", "text/plain");
    });
    server_.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(1 << 20, 'x'), "text/plain");
    });
    server_.Get("/big-chunked", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t offset, httplib::DataSink& sink) {
        if (offset >= (1u << 20)) {
          sink.done();
          return true;
        }
        std::string chunk(64 << 10, 'y');
        return sink.write(chunk.data(), chunk.size());
      });
    });
    server_.Get("/stall", [](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider("text/plain", [](size_t offset, httplib::DataSink& sink) {
        if (offset > 0) {
          std::this_thread::sleep_for(std::chrono::seconds(3));  // stalls, then ends
          sink.done();
          return true;
        }
        return sink.write("a", 1);
      });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 500 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~LocalServer() {
    server_.stop();
    thread_.join();
  }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  std::atomic<int> hits{0};  // requests /ok answered

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(CurlHttpClient, ReturnsStatusHeadersAndBodyAndSendsTheToken) {
  LocalServer server;
  CurlHttpClient client;
  auto r = client.Get({server.Url("/ok"), {{"Authorization", "Bearer hf_secret_token"}}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "{\"authed\":true}");
  EXPECT_EQ(r->Header("Link"), "<http://127.0.0.1/api/models?cursor=abc>; rel=\"next\"");
  EXPECT_EQ(r->Header("content-type"), "application/json");
}

TEST(CurlHttpClient, FollowsTheHubsRelativeRedirects) {
  LocalServer server;
  CurlHttpClient client;
  auto r = client.Get({server.Url("/api/models/bert-base-uncased"), {}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->redirects, 1);
  EXPECT_EQ(r->final_url, server.Url("/api/models/google-bert/bert-base-uncased"));
  EXPECT_EQ(r->Header("X-From-Redirect"), "");  // headers of the final answer only
}

// Note [Redirects checked before they are followed]: a redirect to another
// origin comes back unfollowed; the other server never sees a request.
TEST(CurlHttpClient, ARedirectOffTheOriginIsNotFollowed) {
  LocalServer server, elsewhere;
  CurlHttpClient client;
  auto r = client.Get({server.Url("/away?to=" + elsewhere.Url("/ok")), {{"Authorization", "Bearer hf_secret_token"}}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 302);
  EXPECT_EQ(r->final_url, elsewhere.Url("/ok"));
  EXPECT_EQ(elsewhere.hits.load(), 0);
  // On the same origin it is followed.
  auto same = client.Get({server.Url("/away?to=" + server.Url("/ok")), {}});
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->status, 200);
  EXPECT_EQ(same->redirects, 1);
  EXPECT_EQ(server.hits.load(), 1);
}

TEST(CurlHttpClient, RedirectLoopsAreCutAndTheTokenNeverShows) {
  LocalServer server;
  CurlHttpClient client(CurlOptions{.max_redirects = 3});
  auto r = client.Get({server.Url("/loop"), {{"Authorization", "Bearer hf_secret_token"}}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 0);
  EXPECT_NE(r->error.find("more than 3 redirects"), std::string::npos) << r->error;
  EXPECT_EQ(r->error.find("hf_secret_token"), std::string::npos);
}

TEST(CurlHttpClient, HttpErrorsAreResponsesNotFailures) {
  LocalServer server;
  CurlHttpClient client;
  auto r = client.Get({server.Url("/missing"), {}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(r->Header("X-Error-Code"), "RepoNotFound");
}

TEST(CurlHttpClient, ResponsesOverTheCapAreRefusedAsTheyArrive) {
  LocalServer server;
  CurlHttpClient client(CurlOptions{.max_response_bytes = 64 << 10});
  for (const char* path : {"/big", "/big-chunked"}) {
    auto r = client.Get({server.Url(path), {}});
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 0) << path;
    EXPECT_TRUE(r->body.empty()) << path;
    EXPECT_NE(r->error.find("larger than 65536 bytes"), std::string::npos) << path << ": " << r->error;
    EXPECT_TRUE(r->over_size) << path;  // permanent: the fetcher does not retry it
  }
  auto small = client.Get({server.Url("/ok"), {}});
  ASSERT_TRUE(small.has_value());
  EXPECT_FALSE(small->over_size);
}

TEST(CurlHttpClient, StalledTransfersTimeOut) {
  LocalServer server;
  CurlHttpClient client(CurlOptions{.low_speed_bytes_per_s = 100, .low_speed_time_s = 1});
  const auto t0 = std::chrono::steady_clock::now();
  auto r = client.Get({server.Url("/stall"), {}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 0);
  EXPECT_NE(r->error.find("timed out"), std::string::npos) << r->error;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2900));
}

TEST(CurlHttpClient, RefusedConnectionsAreTransportFailures) {
  int port = 0;
  {
    LocalServer server;  // find a port, then close it
    port = std::stoi(server.Url("").substr(std::string("http://127.0.0.1:").size()));
  }
  CurlHttpClient client;
  auto r = client.Get({"http://127.0.0.1:" + std::to_string(port) + "/ok", {}});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 0);
  EXPECT_FALSE(r->error.empty());
}

TEST(CurlHttpClient, OnlyHttpAndHttpsAreFetched) {
  CurlHttpClient client;
  for (const char* url : {"file:///etc/passwd", "ftp://example.org/x", "gopher://x", "/relative"}) {
    auto r = client.Get({url, {}});
    ASSERT_FALSE(r.has_value()) << url;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace coverage::crawler

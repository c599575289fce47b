// The worker's service (apps/worker_service.h) answers the protocol of
// isolation/isolation.h through the registered test stage families: the
// setup first, then each family's request, every record a JSON value.
#include "apps/worker_service.h"

#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "isolation/protocol.h"
#include "tests/support/case_builder.h"
#include "tests/support/fake_backend.h"
#include "tests/support/shipped_rules.h"

namespace coverage::apps {
namespace {

using nlohmann::json;

WorkerService Service() {
  return WorkerService(
      [](const std::string& name) -> Result<std::shared_ptr<backends::Backend>> {
        if (name != "fake") return Status::NotFound("no backend '" + name + "'");
        auto backend = std::make_shared<testing::FakeBackend>();
        backend->add_offset["aten::mul"] = 1.0;
        return std::shared_ptr<backends::Backend>(backend);
      },
      [](const std::string&, const std::string& model_id, const std::string&) -> Result<Program> {
        return Status::NotFound("no program for " + model_id);
      });
}

std::string SetupRequest(const std::string& backend) {
  isolation::WorkerSetup setup;
  setup.backend = backend;
  setup.tolerances_json = R"({"default_multiplier": 2})";
  setup.tolerances_source = "tolerances.json";
  setup.warm_iterations = 0;
  return json{{"setup", setup.ToJson()}}.dump();
}

TEST(WorkerService, AnswersTheSetupAndThenEachFamilysRequest) {
  WorkerService service = Service();
  EXPECT_NE(json::parse(service.Handle(json{{"unit", testing::MmCase(2, 2, 2).ToJsonValue()}}.dump()))["error"]
                .get<std::string>()
                .find("the first request must be the setup"),
            std::string::npos);
  EXPECT_TRUE(isolation::ParseSetupReply(service.Handle(SetupRequest("nope"))).message().find("nope") != std::string::npos);
  ASSERT_TRUE(isolation::ParseSetupReply(service.Handle(SetupRequest("fake"))).ok());

  // The cases family: the op case goes as a JSON value, the result comes back as one.
  auto pass = isolation::ParseUnitReply(service.Handle(json{{"unit", testing::MmCase(2, 3, 4).ToJsonValue()}}.dump()));
  ASSERT_TRUE(pass.has_value()) << pass.error().ToString();
  EXPECT_EQ(pass->outcome, Outcome::kPass) << pass->error;
  const std::string wrong = service.Handle(json{{"unit", testing::MulCase({2, 3}).ToJsonValue()}}.dump());
  EXPECT_TRUE(json::parse(wrong)["result"]["detail"].is_object()) << wrong;
  auto mismatch = isolation::ParseUnitReply(wrong);
  ASSERT_TRUE(mismatch.has_value()) << mismatch.error().ToString();
  EXPECT_EQ(mismatch->outcome, Outcome::kMismatch);
  auto again = isolation::ParseUnitReply(
      service.Handle(json{{"unit", testing::MulCase({2, 3}).ToJsonValue()}, {"again", true}}.dump()));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->outcome, Outcome::kMismatch);

  // The programs family: without a registry in the setup it says so.
  const json model = json::parse(
      service.Handle(json{{"model", {{"stage", "model"}, {"model_id", "m/x"}, {"profile", "prefill"}}}}.dump()));
  EXPECT_NE(model["error"].get<std::string>().find("without a registry"), std::string::npos) << model.dump();

  // Anything else is an error naming it, never a crash.
  for (const char* line : {"not json", R"({"nothing": {}})", R"({"unit": {"v": 99}})"}) {
    const json reply = json::parse(service.Handle(line));
    EXPECT_TRUE(reply.contains("error")) << line << " -> " << reply.dump();
  }
}

}  // namespace
}  // namespace coverage::apps

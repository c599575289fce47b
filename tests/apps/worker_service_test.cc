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
        if (name != "fake" && name != "bf16") return Status::NotFound("no backend '" + name + "'");
        auto backend = std::make_shared<testing::FakeBackend>();
        backend->add_offset["aten::mul"] = 1.0;
        if (name == "bf16") {  // computes mm from bf16 operands and says so
          backend->operand_mantissa_bits["aten::mm"] = 7;
          backend->numerics = R"({"fp32_operands": "bf16", "ops": {"aten::mm": ["self", "mat2"]}})";
        }
        return std::shared_ptr<backends::Backend>(backend);
      },
      [](const std::string&, const std::string& model_id, const std::string&) -> Result<Program> {
        return Status::NotFound("no program for " + model_id);
      });
}

std::string SetupRequest(const std::string& backend, const std::string& numerics_source = "none") {
  isolation::WorkerSetup setup;
  setup.backend = backend;
  setup.numerics_source = numerics_source;
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
  EXPECT_TRUE(isolation::ParseSetupReply(service.Handle(SetupRequest("nope"))).error().message().find("nope") !=
              std::string::npos);
  ASSERT_TRUE(isolation::ParseSetupReply(service.Handle(SetupRequest("fake"))).has_value());

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

// Note [Declared numerics]: a worker asked to use the backend's own
// declaration judges under it and says which in its setup reply; with
// "none" the same backend fails at fp32 precision.
TEST(WorkerService, AWorkerJudgesUnderTheNumericsTheBackendDeclares) {
  for (const std::string& source : {std::string(isolation::WorkerSetup::kAskBackend), std::string("none")}) {
    WorkerService service = Service();
    auto ready = isolation::ParseSetupReply(service.Handle(SetupRequest("bf16", source)));
    ASSERT_TRUE(ready.has_value()) << ready.error().ToString();
    const bool declared = source != "none";
    EXPECT_EQ(ready->numerics.empty(), !declared) << ready->numerics;
    auto mm = isolation::ParseUnitReply(
        service.Handle(json{{"unit", testing::MmCase(32, 256, 16).ToJsonValue()}}.dump()));
    ASSERT_TRUE(mm.has_value()) << mm.error().ToString();
    EXPECT_EQ(mm->outcome, declared ? Outcome::kPass : Outcome::kMismatch) << source << ": " << mm->error;
  }
}

}  // namespace
}  // namespace coverage::apps

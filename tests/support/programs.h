// The traced program fixtures (tests/fixtures/programs, regenerate.sh): a
// tiny Llama's prefill and training step as the tracer recorded them. Needs
// COVERAGE_SOURCE_DIR and coverage_capture (the trace reader).
#pragma once

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "capture/trace_reader.h"
#include "core/program.h"

namespace coverage::testing {

inline Program LoadProgramFixture(const std::string& name) {
  std::ifstream in(std::string(COVERAGE_SOURCE_DIR) + "/tests/fixtures/programs/" + name);
  EXPECT_TRUE(in.good()) << name;
  capture::TraceReader reader;
  std::string line;
  while (std::getline(in, line)) {
    Status s = reader.Feed(line);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  auto outcome = reader.Finish();
  EXPECT_TRUE(outcome.has_value() && outcome->program.has_value()) << name;
  return outcome.has_value() && outcome->program ? *outcome->program : Program{};
}

}  // namespace coverage::testing

// How fast `coverage registry query|stats|export` and stage planning read a
// registry of tens of thousands of cases. Builds a scratch registry of N
// synthetic cases (default 30,000: matmuls, elementwise ops and softmaxes over
// transformer-like shapes from 50 models), then times each kind of filter
// side by side.
//
//   build/bin/bench_registry_query [--cases 30000]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "registry/registry.h"

using namespace coverage;

namespace {

Argument Tensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  Argument a;
  a.name = std::move(name);
  a.kind = Argument::Kind::kTensor;
  a.tensor.dtype = dtype;
  a.tensor.strides.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) a.tensor.strides[i - 1] = a.tensor.strides[i] * shape[i];
  a.tensor.shape = std::move(shape);
  return a;
}

OpCase Synthetic(int i) {
  static const int64_t kHidden[] = {768, 1024, 2048, 3072, 4096, 5120, 8192};
  static const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  const int64_t h = kHidden[i % 7], tokens = 1 + (i / 7) % 512, batch = 1 + (i / 3584) % 8;
  const DType dt = kTypes[(i / 11) % 3];
  OpCase c;
  switch (i % 3) {
    case 0:
      c.op = "aten::mm";
      c.args = {Tensor("self", dt, {batch * tokens, h}), Tensor("mat2", dt, {h, 4 * h})};
      break;
    case 1: {
      c.op = "aten::add";
      c.overload = "Tensor";
      Argument alpha;
      alpha.name = "alpha";
      alpha.kind = Argument::Kind::kInt;
      alpha.i = 1;
      c.args = {Tensor("self", dt, {batch, tokens, h}), Tensor("other", dt, {batch, tokens, h}), alpha};
      break;
    }
    default: {
      c.op = "aten::softmax";
      c.overload = "int";
      Argument dim;
      dim.name = "dim";
      dim.kind = Argument::Kind::kInt;
      dim.i = -1;
      c.args = {Tensor("self", dt, {batch, h / 64, tokens, tokens}), dim};
    }
  }
  return c;
}

template <typename Fn>
double TimeMs(Fn&& fn, size_t* rows) {
  const auto t0 = std::chrono::steady_clock::now();
  *rows = fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int n = 30000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--cases") n = std::stoi(argv[i + 1]);
  }
  const std::string path = (std::filesystem::temp_directory_path() / "bench_registry_query.db").string();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  auto reg = registry::Registry::Open(path);
  if (!reg) {
    std::fprintf(stderr, "%s\n", reg.error().ToString().c_str());
    return 2;
  }
  auto& r = **reg;
  const auto t0 = std::chrono::steady_clock::now();
  if (!r.Begin().ok()) return 2;
  for (int i = 0; i < n; ++i) {
    auto id = r.UpsertCase(Synthetic(i), {1e6 * (i % 1000), 0});
    if (!id) return 2;
    registry::CaseSource src{fmt::format("org{}/model-{}", i % 5, i % 50), "layers.0", "", i % 2 ? "decode" : "prefill",
                             0, 1};
    if (!r.AddCaseSource(*id, src).ok()) return 2;
  }
  if (!r.Commit().ok()) return 2;
  const double insert_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d cases written in %.0f ms (%.1f us per case with its source row, one transaction)\n\n", n, insert_ms,
              1e3 * insert_ms / n);

  struct Query {
    const char* name;
    registry::CaseFilter filter;
  };
  auto dim = [](const char* text) { return *registry::ParseDimPredicate(text); };
  std::vector<Query> queries = {
      {"all cases (export, stage planning)", {}},
      {"--op mm", {.ops = {"mm"}}},
      {"--dtype bf16", {.dtype = "bf16"}},
      {"--model 'org1/*'", {.model = "org1/*"}},
      {"--profile decode", {.profile = "decode"}},
      {"--dim 'self[-1]>=4096'", {.dims = {dim("self[-1]>=4096")}}},
      {"--op mm --dim 'mat2[1]==16384' --dtype f16", {.ops = {"mm"}, .dtype = "f16", .dims = {dim("mat2[1]==16384")}}},
      {"--max-flops 1e8", {.max_flops = 1e8}},
  };
  std::printf("%-46s %8s %10s %14s\n", "filter", "rows", "ms", "us per case");
  for (const auto& q : queries) {
    size_t rows = 0;
    TimeMs([&] { return r.FindCases(q.filter)->size(); }, &rows);  // warm the page cache
    const double ms = TimeMs([&] { return r.FindCases(q.filter)->size(); }, &rows);
    std::printf("%-46s %8zu %10.1f %14.2f\n", q.name, rows, ms, 1e3 * ms / n);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return 0;
}

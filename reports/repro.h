// Reproductions of one op case for people: what `coverage repro` prints.
// Torch-free: the Python snippet is text, for a machine with PyTorch.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/op_case.h"

namespace coverage::reports {

// Where the script's device call runs: "cpu", "cuda", or a PrivateUse1
// plugin the script loads itself (torch.ops.load_library), giving the device
// `device_name` when the plugin leaves it unnamed ("privateuseone"), and
// registering a device module for it (torch._register_device_module) when
// the plugin's Python side is not there: without one, PyTorch fails at the
// first tensor with "No module named 'torch.<name>'".
struct ReproTarget {
  std::string device = "cpu";  // with a plugin: ignored, the script asks PyTorch for the device's name
  std::string plugin;          // the plugin's .so, absolute; "" for none
  std::string device_name;     // "" keeps the name the plugin registered
  std::vector<std::pair<std::string, std::string>> environment;  // os.environ defaults set before loading it
};

// A self-contained Python script that builds the case's inputs with the same
// shapes, dtypes, strides, storage offsets and value domains (from
// torch.manual_seed(seed); the values are not bit-identical to the unit
// stage's), calls torch.ops.aten.<op>.<overload> on the CPU and on the
// target's device, and prints the largest difference. Keyword arguments by
// schema name.
std::string PythonRepro(const OpCase& op_case, uint64_t seed, const ReproTarget& target);

}  // namespace coverage::reports

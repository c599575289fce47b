// Checks and defaults the subcommands' flags share.
#pragma once

#include <CLI/CLI.hpp>

namespace coverage::apps {

// Every number a user types: finite and in [lo, hi] (CLI::Range lets NaN
// and inf through).
CLI::Validator FiniteRange(double lo, double hi);

// An intra-op thread count: 0 (one per core) up to the cores this process
// may run on; more threads than cores only oversubscribe the machine.
CLI::Validator ThreadCount();

// A run id (Note [Run ids] in core/text_safety.h).
CLI::Validator RunIdCheck();

// A seed: a whole number in [0, 2^64 - 1], as typed (before, -1 wrapped to
// 2^64 - 1 and 2^64 saturated to it).
CLI::Validator SeedCheck();

// A PrivateUse1 device's name for --device-name: lower-case letters, digits
// and '_', not one of PyTorch's own device types.
CLI::Validator DeviceNameCheck();

// This machine's physical memory in GB (10^9 bytes); 8 when unknown.
double PhysicalMemoryGb();

}  // namespace coverage::apps

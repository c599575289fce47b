// Precompiled header for the torch-facing translation units of backends/,
// replay/, their tests and benchmarks: ATen's umbrella header is the bulk of their compile time.
#pragma once
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

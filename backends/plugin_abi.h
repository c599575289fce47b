/* The optional C ABI of a PrivateUse1 backend plugin (`--backend
 * privateuse1:/path/to/plugin.so`, backends/plugin_backend.h).
 *
 * A plugin is a shared library that registers, from its static
 * initialisers, what an out-of-tree PyTorch accelerator registers: an
 * allocator for c10::DeviceType::PrivateUse1 (c10::SetAllocator), a
 * c10::impl::DeviceGuardImplInterface (C10_REGISTER_GUARD_IMPL) and ATen
 * kernels under TORCH_LIBRARY_IMPL(aten, PrivateUse1, m), at least
 * aten::empty.memory_format. coverage loads it with dlopen(RTLD_NOW |
 * RTLD_GLOBAL) and checks that all three are there.
 *
 * Beyond that, a plugin MAY export any of the functions below with C
 * linkage; each is looked up with dlsym and every one is optional. All
 * returned strings are owned by the plugin, NUL-terminated, and must stay
 * valid until the next call of the same function from the same thread.
 * coverage calls them from one thread at a time.
 *
 * This header is plain C so that plugins in any language can implement it.
 */
#ifndef COVERAGE_RUNNERS_PLUGIN_ABI_H_
#define COVERAGE_RUNNERS_PLUGIN_ABI_H_

#ifdef __cplusplus
extern "C" {
#endif

/* Called after loading, and again each time a backend is created from the
 * plugin (a plugin may re-read its configuration here). Returns NULL when
 * the backend is ready, else an error message that coverage shows as the
 * reason the backend cannot be used. */
const char* coverage_backend_init(void);

/* Version of the plugin's software stack, stored with each run. */
const char* coverage_backend_version(void);

/* A JSON object of cumulative integer counters since the process started,
 * e.g. {"compiles": 3, "cache_hits": 12, "fallbacks": 15}. coverage records,
 * per case, how much each counter grew while the case ran on the backend. */
const char* coverage_backend_counters(void);

/* Waits until all work queued on the device has finished; called after each
 * timed backend call. */
void coverage_backend_synchronize(void);

/* How the backend computes where it differs from exact fp32 on purpose, as
 * JSON, or "" (or NULL) for nowhere: {"fp32_operands": "bf16" | "tf32",
 * "ops": {"aten::mm": ["self", "mat2"], ...}} says the fp32 operands of
 * these ops (by schema argument name; [] for every fp32 input) are rounded
 * before the op computes in fp32. The CPU reference then computes the same
 * way, so the backend is judged against what it declares (configs/README.md,
 * "numerics"). A file configs/numerics/<backend>.json takes precedence. */
const char* coverage_backend_numerics(void);

#ifdef __cplusplus
}
#endif

#endif /* COVERAGE_RUNNERS_PLUGIN_ABI_H_ */

// libcoverage_testdev.so: a third-party PrivateUse1 plugin laid out as a
// backend team ships one. This library is what `--backend
// privateuse1:<path>` loads; it holds no kernels itself. Its kernels,
// allocator, guard and hooks live in libcoverage_testdev_kernels.so beside
// it (found through $ORIGIN), which registers them from its static
// initialisers and renames the device to "testdev". The kernels library is
// built from sim's sources under that name (tests/CMakeLists.txt), so the
// test exercises the loader, the rename and the dependent library, not new
// kernels.
//
// Only the version hook of backends/plugin_abi.h is defined here; the others
// come from the kernels library (dlsym on this handle searches its
// dependencies too).
extern "C" __attribute__((visibility("default"))) const char* coverage_backend_version(void) {
  return "testdev 0.1 (kernels in libcoverage_testdev_kernels.so)";
}

// main() of the test executables that need a CUDA device. Without one they list only their
// host-side tests (argument checks named *.Rejects* or *.Refuses*, and suites named *Host), so a
// build machine without a GPU (CI) registers those with ctest and not hundreds that could only
// skip. scripts/gpu-check runs them on the GPU machine with MOE_GPU_TESTS=required, where a missing
// device fails the run instead of passing the host tests alone.
#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>
#include <string>

#include "tests/cuda/gpu_test_env.h"

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const std::string why = moe::test::cuda_unavailable_reason();
  if (!why.empty()) {
    const char* mode = std::getenv("MOE_GPU_TESTS");
    if (mode && std::string(mode) == "required") {
      std::cerr << "no CUDA device (" << why << "), and MOE_GPU_TESTS=required\n";
      return 1;
    }
    // A filter given on the command line (ctest names one discovered test) stands.
    if (GTEST_FLAG_GET(filter) == "*") GTEST_FLAG_SET(filter, "*.Rejects*:*.Refuses*:*Host.*");
  }
  return RUN_ALL_TESTS();
}

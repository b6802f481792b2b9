// Current device and its multiprocessor count, cached per device (a persistent GEMM sizes its grid by it).
#pragma once

#include <cuda_runtime.h>

namespace gemmbn {

cudaError_t current_device_info(int& device, int& sm_count);

}  // namespace gemmbn

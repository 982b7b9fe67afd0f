// For the standalone CUDA programs in bench/gpu (built by nvcc alone, without
// the wsync libraries): a call whose result is not `ok` prints the call, its
// place and describe(result) on stderr and ends the program with status 1.
//   #define CK(x) WSYNC_EXIT_ON_ERROR(x, cudaSuccess, cudaGetErrorString)
#ifndef WSYNC_BENCH_GPU_EXIT_ON_ERROR_H_
#define WSYNC_BENCH_GPU_EXIT_ON_ERROR_H_

#include <cstdio>
#include <cstdlib>

#define WSYNC_EXIT_ON_ERROR(x, ok, describe)                                        \
  do {                                                                              \
    auto e_ = (x);                                                                  \
    if (e_ != (ok)) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, describe(e_)); \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

#endif  // WSYNC_BENCH_GPU_EXIT_ON_ERROR_H_

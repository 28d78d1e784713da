#include "kvlab/core/blas.h"

#include <dlfcn.h>

namespace kvlab {

namespace {
template <class Fn>
Fn find(const char* symbol) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, symbol));
}
}  // namespace

BlasInfo blas_info() {
  BlasInfo b{"unknown", "unknown", 0};
  if (auto config = find<char* (*)()>("openblas_get_config")) b.name = config();
  if (auto parallel = find<int (*)()>("openblas_get_parallel")) {
    const int p = parallel();  // OpenBLAS: 0 sequential, 1 pthreads, 2 OpenMP
    b.threading = p == 2 ? "openmp" : p == 1 ? "pthread" : p == 0 ? "sequential" : "unknown";
  }
  if (auto threads = find<int (*)()>("openblas_get_num_threads")) b.threads = threads();
  return b;
}

void set_blas_threads(int n) {
  if (auto f = find<void (*)(int)>("openblas_set_num_threads")) f(n);
}

}  // namespace kvlab

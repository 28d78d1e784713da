#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <ATen/Parallel.h>

#include <thread>

int main(int argc, char** argv) {
  at::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  doctest::Context ctx(argc, argv);
  return ctx.run();
}

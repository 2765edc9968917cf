// Catch2 2.x (Debian) and 3.x (the GPU machine) behind one include.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define GPUMEM_CATCH3 1
#else
#include <catch2/catch.hpp>
#define GPUMEM_CATCH3 0
#endif

#include <atomic>

// Skips the current test with a message: SKIP on Catch2 3 (a run where every case skipped exits
// 4); on Catch2 2, a warning, a count that catch_main.cpp turns into ctest's "Skipped" (see there),
// and return. Use it in a TEST_CASE's body (it returns from the enclosing function).
#if GPUMEM_CATCH3
#define GPUMEM_SKIP(msg) SKIP(msg)
#else
namespace gpumem_test_support {
inline std::atomic<int> skipped_cases{0};
}  // namespace gpumem_test_support
#define GPUMEM_SKIP(msg)                  \
  do {                                    \
    ++::gpumem_test_support::skipped_cases;   \
    WARN(msg);                            \
    return;                               \
  } while (false)
#endif

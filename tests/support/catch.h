// Catch2 2.x (Debian) and 3.x (the GPU machine) behind one include.
#pragma once

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#define GPUMEM_CATCH3 1
#else
#include <catch2/catch.hpp>
#define GPUMEM_CATCH3 0
#endif

// Skips the current test with a message: SKIP on Catch2 3, a warning and return on Catch2 2.
#if GPUMEM_CATCH3
#define GPUMEM_SKIP(msg) SKIP(msg)
#else
#define GPUMEM_SKIP(msg) \
  do {                   \
    WARN(msg);           \
    return;              \
  } while (false)
#endif

// The test runner's main for Catch2 2.x; Catch2 3.x links Catch2::Catch2WithMain instead.
#if __has_include(<catch2/catch_all.hpp>)
#error "catch_main.cpp is only for Catch2 2.x"
#else
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif

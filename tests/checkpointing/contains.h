// A substring matcher for CHECK_THROWS_WITH on both Catch2 2 and 3.
#pragma once

#include "catch.h"

#if GPUMEM_CATCH3
#define CKPT_CONTAINS(text) Catch::Matchers::ContainsSubstring(text)
#else
#define CKPT_CONTAINS(text) Catch::Matchers::Contains(text)
#endif

// Counts the process's heap allocations (plain operator new, replaced in alloc_counter.cpp, which
// is linked into the test executable; under AddressSanitizer every allocation, through its hooks),
// to check that code paths allocate nothing.
#pragma once

#include <cstdint>

namespace moe::test {

int64_t allocation_count();

}  // namespace moe::test

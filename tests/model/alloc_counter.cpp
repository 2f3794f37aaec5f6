#include "tests/model/alloc_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_allocs{0};
}  // namespace

#if defined(__SANITIZE_ADDRESS__)
// AddressSanitizer owns operator new (a replacement would mismatch its deallocations), but it
// reports every allocation to a hook (sanitizer/allocator_interface.h, not always installed).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*,
                                                                             size_t),
                                                         void (*free_hook)(const volatile void*));

namespace {
void on_alloc(const volatile void*, size_t) { g_allocs.fetch_add(1, std::memory_order_relaxed); }
void on_free(const volatile void*) {}
const int g_hooks_installed = __sanitizer_install_malloc_and_free_hooks(on_alloc, on_free);
}  // namespace

#else
// Its own translation unit: GCC's -Wmismatched-new-delete misreads a replaced pair inlined into
// the callers.
void* operator new(std::size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace moe::test {

int64_t allocation_count() { return g_allocs.load(std::memory_order_relaxed); }

}  // namespace moe::test

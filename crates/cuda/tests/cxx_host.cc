// A C++ host of tensor-arena-cuda's C ABI: loads the library given as its
// argument, allocates, and catches std::bad_alloc for a request past the
// device's memory (the simulated driver). Used by tests/c_abi.rs (the
// cargo-built library) and tools/wheel-check.sh (the wheel's library).
#include <cstdio>
#include <dlfcn.h>
#include <new>
typedef void* (*alloc_t)(long, int, void*);
typedef void (*free_t)(void*, long, int, void*);
int main(int argc, char** argv) {
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { std::printf("dlopen: %s\n", dlerror()); return 2; }
    alloc_t a = (alloc_t)dlsym(lib, "tensor_arena_cuda_alloc");
    alloc_t c = (alloc_t)dlsym(lib, "tensor_arena_cuda_try_alloc");
    free_t f = (free_t)dlsym(lib, "tensor_arena_cuda_free");
    void* p = a(1 << 20, 0, nullptr);
    std::printf("small: %s\n", p ? "ok" : "null");
    std::printf("zero: %s\n", a(0, 0, nullptr) ? "non-null" : "null");
    try {
        void* q = a(1L << 50, 0, nullptr);
        std::printf("huge: returned %p\n", q);
    } catch (const std::bad_alloc&) {
        std::printf("huge: caught std::bad_alloc\n");
    }
    std::printf("huge, C entry: %s\n", c(1L << 50, 0, nullptr) ? "non-null" : "null");
    void* r = a(1 << 20, 0, nullptr);
    std::printf("after: %s\n", r && r != p ? "ok" : "bad");
    f(p, 0, 0, nullptr);
    f(r, 0, 0, nullptr);
    return 0;
}

/* gpu_test.h — what the GPU conformance tests (tests/gpu/test_*.c) share:
 * the pair of backends they compare (the CPU reference and CUDA device 0)
 * and a seeded xorshift64 source of random values.
 *
 * Inputs are random and never exactly zero: a kernel that skips work or
 * reads the wrong element must not pass by multiplying zeros. Each test
 * binary includes this once; GPU_TEST_SEED (defined before the include)
 * picks its stream, so a file's inputs do not change when another file's
 * tests do. Header-only (static), like tests/test.h. */
#ifndef NS_TESTS_GPU_TEST_H
#define NS_TESTS_GPU_TEST_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"

#ifndef GPU_TEST_SEED
#define GPU_TEST_SEED 0x9e3779b97f4a7c15ULL
#endif

static ns_backend *cpu, *gpu;
static uint64_t rs = GPU_TEST_SEED;

static uint64_t next_u64(void) {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

/* uniform in [-1, 1), never exactly zero */
static float frand(void) {
    float f = (float)((double)(next_u64() >> 40) / 8388608.0 - 1.0);
    return f == 0.0f ? 0.5f : f;
}

/* Creates `cpu` (cpu_threads threads) and `gpu`; on failure prints the TAP
 * setup failure and returns false (the caller exits 1). */
static bool gpu_test_open(int cpu_threads) {
    ns_error err = {0};
    if (ns_backend_cuda_create(0, &gpu, &err) != NS_OK) {
        printf("not ok - setup: cuda backend: %s\n", err.msg);
        return false;
    }
    if (ns_backend_cpu_create(cpu_threads, &cpu, &err) != NS_OK) {
        printf("not ok - setup: cpu backend: %s\n", err.msg);
        return false;
    }
    return true;
}

#endif

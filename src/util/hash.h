/* hash.h — the integer mixing functions (header-only, also usable in CUDA
 * device code): MurmurHash3's 64-bit finalizer for hash tables, and
 * SplitMix64 for seeding generators and for deterministic pseudo-random
 * values. */
#ifndef NS_HASH_H
#define NS_HASH_H

#include <stdint.h>

#ifdef __CUDACC__
#define NS_HOSTDEV __host__ __device__
#else
#define NS_HOSTDEV
#endif

/* MurmurHash3's fmix64: a bijective mix in which every input bit affects
 * every output bit. */
static inline NS_HOSTDEV uint64_t ns_mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* SplitMix64's output function applied to z. */
static inline NS_HOSTDEV uint64_t ns_splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* SplitMix64: advances *state by the golden-ratio increment and returns
 * the next value. */
static inline uint64_t ns_splitmix64(uint64_t *state) { return ns_splitmix64_mix(*state += 0x9e3779b97f4a7c15ULL); }

#endif

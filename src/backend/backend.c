#include "backend/backend.h"

#include <string.h>

const char *ns_dtype_name(ns_dtype dt) {
    switch (dt) {
    case NS_DT_F32: return "f32";
    case NS_DT_BF16: return "bf16";
    case NS_DT_F16: return "f16";
    case NS_DT_Q8_0: return "q8_0";
    case NS_DT_Q4_0: return "q4_0";
    case NS_DT_Q4_K: return "q4_k";
    case NS_DT_Q5_K: return "q5_k";
    case NS_DT_Q6_K: return "q6_k";
    case NS_DT_Q4_1: return "q4_1";
    case NS_DT_Q5_0: return "q5_0";
    case NS_DT_Q5_1: return "q5_1";
    case NS_DT_FP8_E4M3: return "fp8";
    }
    return "?";
}

ns_status ns_backend_create(const char *name, int n_threads, ns_backend **out, ns_error *err) {
    *out = NULL;
    if (!name || strcmp(name, "cpu") == 0) return ns_backend_cpu_create(n_threads, out, err);
    if (strcmp(name, "cuda") == 0) {
#ifdef NS_HAVE_CUDA
        return ns_backend_cuda_create(0, out, err);
#else
        return ns_fail(err, NS_ERR_UNSUPPORTED, "this build has no CUDA backend (rebuild with make CUDA=1)");
#endif
    }
    return ns_fail(err, NS_ERR_INVALID, "unknown device \"%s\" (cpu or cuda)", name);
}

ns_status ns_kv_dtype_choose(const char *name, const char *backend, ns_dtype *out, ns_error *err) {
    const bool cpu = !backend || strcmp(backend, "cpu") == 0;
    if (!name || strcmp(name, "auto") == 0) {
        *out = cpu ? NS_DT_F32 : NS_DT_BF16;
        return NS_OK;
    }
    if (strcmp(name, "fp8") == 0) {
        *out = NS_DT_FP8_E4M3;
        return NS_OK;
    }
    if (strcmp(name, "f32") == 0) {
        if (!cpu) return ns_fail(err, NS_ERR_INVALID, "--kv-dtype f32: the %s backend stores KV as bf16 or fp8", backend);
        *out = NS_DT_F32;
        return NS_OK;
    }
    if (strcmp(name, "bf16") == 0) {
        if (cpu) return ns_fail(err, NS_ERR_INVALID, "--kv-dtype bf16: the cpu backend stores KV as f32 or fp8");
        *out = NS_DT_BF16;
        return NS_OK;
    }
    return ns_fail(err, NS_ERR_INVALID, "--kv-dtype must be auto, bf16, f32 or fp8, not \"%s\"", name);
}

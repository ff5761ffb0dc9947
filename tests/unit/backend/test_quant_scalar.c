/* The scalar fallback of quant.c (what a build without AVX2 runs), under
 * the same tests as the AVX2 kernels (test_quant.c): the module's source is
 * compiled into this test with the target feature macros undefined, so its
 * #ifdef __AVX2__ / __F16C__ paths drop out; its definitions replace the
 * library's (the linker then never pulls quant.o from the archive). */
#undef __AVX2__
#undef __AVX512F__
#undef __F16C__
#include "backend/cpu/quant.c"

#include "test_quant.c"

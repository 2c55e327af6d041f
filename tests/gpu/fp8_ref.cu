/* Host-side E4M3 conversions for tests/gpu/test_fp8.c, from CUDA's own
 * cuda_fp8.h (the reference the quantize kernels are checked against; a C
 * test cannot include that C++ header). */
#include <cuda_fp8.h>
#include <stdint.h>

/* e4m3(v): round to nearest even, saturating to +-448 (satfinite). */
extern "C" uint8_t fp8_ref_e4m3(float v) {
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

/* The value of an E4M3 byte. */
extern "C" float fp8_ref_value(uint8_t q) {
    __nv_fp8_e4m3 x;
    x.__x = (__nv_fp8_storage_t)q;
    return (float)x;
}

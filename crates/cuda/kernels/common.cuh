// Shared device helpers for deltakv's CUDA kernels. Kernels are compiled by NVRTC with no
// CUDA headers, so the half-precision conversions are written with PTX `cvt` and bit
// operations here.

typedef unsigned long long u64;
typedef long long i64;

// dtype codes, as `DType::code` on the Rust side.
#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_I64 4

__device__ __forceinline__ float bf16_to_f32(unsigned short x) {
    return __uint_as_float(((unsigned)x) << 16);
}

// Round to nearest even; NaN stays NaN (quiet bit set).
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (unsigned short)((u >> 16) | 0x40u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(unsigned short x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
    return f;
}

__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Element `index` of a float tensor of dtype `dtype` (f32, f16 or bf16), widened to f32.
__device__ __forceinline__ float load_float(const void* base, i64 index, int dtype) {
    if (dtype == DT_F32) return ((const float*)base)[index];
    unsigned short bits = ((const unsigned short*)base)[index];
    return dtype == DT_BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
}

// Stores `value` rounded to `dtype` (f32, f16 or bf16).
__device__ __forceinline__ void store_float(void* base, i64 index, int dtype, float value) {
    if (dtype == DT_F32) {
        ((float*)base)[index] = value;
    } else {
        ((unsigned short*)base)[index] = dtype == DT_BF16 ? f32_to_bf16(value) : f32_to_f16(value);
    }
}

// Element `index` of an i32 or i64 tensor.
__device__ __forceinline__ i64 load_index(const void* base, i64 index, int dtype) {
    return dtype == DT_I64 ? ((const i64*)base)[index] : (i64)((const int*)base)[index];
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

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

// The two-step form of `load_float` for latency-bound kernels: `load_bits` issues the load
// (all 32 bits for f32, the low 16 for f16 and bf16) as two predicated loads into one register,
// not a branch, so nothing waits for the data until `bits_to_float` uses it; `load_float`'s
// conversion inside a dtype branch makes each load wait for its data before the next one is
// issued.
__device__ __forceinline__ unsigned load_bits(const void* base, i64 index, int dtype) {
    unsigned bits;
    asm("{\n\t.reg .pred wide;\n\tsetp.eq.s32 wide, %3, %4;\n\t"
        "@wide ld.global.u32 %0, [%1];\n\t@!wide ld.global.u16 %0, [%2];\n\t}"
        : "=r"(bits)
        : "l"((const unsigned*)base + index), "l"((const unsigned short*)base + index), "r"(dtype),
          "n"(DT_F32));
    return bits;
}

__device__ __forceinline__ float bits_to_float(unsigned bits, int dtype) {
    if (dtype == DT_F32) return __uint_as_float(bits);
    return dtype == DT_BF16 ? __uint_as_float(bits << 16) : f16_to_f32((unsigned short)bits);
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

// `load_index` as predicated loads of both widths (see `load_bits`): the first use waits.
__device__ __forceinline__ i64 load_index_async(const void* base, i64 index, int dtype) {
    i64 value;
    asm("{\n\t.reg .pred wide;\n\tsetp.eq.s32 wide, %3, %4;\n\t"
        "@wide ld.global.s64 %0, [%1];\n\t@!wide ld.global.s32 %0, [%2];\n\t}"
        : "=l"(value)
        : "l"((const i64*)base + index), "l"((const int*)base + index), "r"(dtype), "n"(DT_I64));
    return value;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// Shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}

// Asynchronous 16-byte copies from global into shared memory (`cp.async`, L2 only), in commit
// groups; cp_async_wait<N> waits until at most N of this thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same where `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(shared_address(dst)),
                 "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }

// Bulk copies through the copy engine (sm_90): one thread moves a contiguous range (16-byte
// aligned, a multiple of 16 bytes) from global into shared memory, and the copy's bytes count
// down the transaction count of an mbarrier, whose phase completes once its arrivals and its
// expected bytes are all in.
__device__ __forceinline__ void bulk_barrier_init(unsigned long long* bar, unsigned arrivals = 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(arrivals)
                 : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival on `bar` that also expects `bytes` more of bulk copies in this phase.
__device__ __forceinline__ void bulk_expect(unsigned long long* bar, unsigned bytes) {
    asm volatile("{ .reg .b64 state; mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1; }"
                 ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
        ::"r"(shared_address(dst)), "l"(src), "r"(bytes), "r"(shared_address(bar)) : "memory");
}

// Waits until the phase of `bar` with parity `phase` has completed.
__device__ __forceinline__ void bulk_wait(unsigned long long* bar, unsigned phase) {
    unsigned done = 0;
    while (!done) {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(shared_address(bar)), "r"(phase) : "memory");
    }
}

// One arrival on `bar` (release: the thread's earlier writes are visible to whoever sees the
// phase complete).
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(shared_address(bar))
                 : "memory");
}

//! Runtime CPU-feature dispatch. Kernels are written once as `#[inline(always)]` generic code
//! over `MulAdd`; a `#[target_feature(enable = "avx2,fma")]` wrapper instantiates them with
//! fused multiply-add so LLVM emits 256-bit FMA code, and a plain wrapper serves other CPUs.
//! (`f32::mul_add` without the `fma` feature is a slow libm call, hence two flavours.)

/// How a kernel spells `a * b + c`.
pub(crate) trait MulAdd: Copy {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// Fused: one rounding, one instruction where `fma` is enabled.
#[derive(Clone, Copy)]
pub(crate) struct Fused;

/// Unfused: multiply then add, for CPUs without FMA.
#[derive(Clone, Copy)]
pub(crate) struct Unfused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// The widest instruction set kernels may use, lowered by tests so that every dispatch path
/// is exercised on a machine that has them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum SimdLimit {
    /// Portable code only.
    Baseline = 0,
    /// Up to AVX2 + FMA.
    Avx2 = 1,
    /// Up to AVX-512F (no VBMI or other extensions).
    Avx512 = 2,
    /// Everything the CPU has.
    Any = 3,
}

static SIMD_LIMIT: std::sync::atomic::AtomicU8 =
    std::sync::atomic::AtomicU8::new(SimdLimit::Any as u8);

/// Caps the instruction set CPU kernels dispatch to (process-wide). For tests and
/// benchmarks; results are the same to rounding at every level.
pub fn set_simd_limit(limit: SimdLimit) {
    SIMD_LIMIT.store(limit as u8, std::sync::atomic::Ordering::Relaxed);
}

fn limit_allows(level: SimdLimit) -> bool {
    SIMD_LIMIT.load(std::sync::atomic::Ordering::Relaxed) >= level as u8
}

/// True when the running CPU has AVX2 and FMA (checked once, then cached by std).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        limit_allows(SimdLimit::Avx2)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the running CPU has AVX-512 VBMI and VL as well as [`has_avx512`]'s set.
#[inline]
pub(crate) fn has_vbmi() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        limit_allows(SimdLimit::Any)
            && has_avx512()
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the running CPU has AVX-512F (as well as AVX2 and FMA).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        limit_allows(SimdLimit::Avx512)
            && std::arch::is_x86_feature_detected!("avx512f")
            && has_avx2_fma()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A raw view of an output buffer that parallel tasks write at disjoint offsets.
pub(crate) struct DisjointWriter<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks only obtain disjoint ranges (see `range`), so sharing the pointer is sound.
unsafe impl<T: Send> Send for DisjointWriter<'_, T> {}
unsafe impl<T: Send> Sync for DisjointWriter<'_, T> {}

impl<'a, T> DisjointWriter<'a, T> {
    pub(crate) fn new(buffer: &'a mut [T]) -> Self {
        Self {
            ptr: buffer.as_mut_ptr(),
            len: buffer.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements in the buffer.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The start of the buffer (for prefetch hints and in-place kernels that keep to their own
    /// ranges).
    pub(crate) fn as_ptr(&self) -> *mut T {
        self.ptr
    }

    /// The sub-slice `offset..offset + len`.
    ///
    /// # Safety
    /// No two live slices obtained from this writer may overlap.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range(&self, offset: usize, len: usize) -> &mut [T] {
        assert!(
            offset + len <= self.len,
            "DisjointWriter range out of bounds"
        );
        // SAFETY: in bounds (checked above); disjointness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) }
    }
}

/// Defines `fn $name(args) -> ret`, compiled with `#[target_feature(enable = $features)]`
/// (x86_64 only), whose body is `$body(args)`: an inline-always generic body then gets the
/// wider instructions. Callers check the CPU before calling the (then unsafe) function.
macro_rules! target_build {
    ($name:ident, $features:literal, $body:path, ($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) $(-> $ret)? {
            $body($($arg),*)
        }
    };
}
pub(crate) use target_build;

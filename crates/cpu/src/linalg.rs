//! Small dense f32 matrix products for the chunked kernels, on top of the `gemm` crate (which
//! picks AVX2/AVX-512/NEON micro-kernels at run time). Matrices are strided views so that
//! transposes cost nothing.

/// A read-only strided matrix view: element (r, c) is `data[r * row_stride + c * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// Row-major `rows x cols` with the given row stride.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    fn last_index(&self) -> usize {
        if self.rows == 0 || self.cols == 0 {
            0
        } else {
            (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride
        }
    }
}

/// `dst = dst_scale * dst + product_scale * lhs . rhs`, `dst` row-major with `dst_row_stride`.
/// With `dst_scale == 0` the old contents of `dst` are not read (NaN poison is overwritten).
pub(crate) fn matmul(
    dst: &mut [f32],
    dst_row_stride: usize,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    dst_scale: f32,
    product_scale: f32,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(rhs.rows, k, "matmul inner dimensions differ");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        lhs.last_index() < lhs.data.len() || k == 0,
        "lhs view out of bounds"
    );
    assert!(
        rhs.last_index() < rhs.data.len() || k == 0,
        "rhs view out of bounds"
    );
    assert!(
        (m - 1) * dst_row_stride + n <= dst.len(),
        "dst view out of bounds"
    );
    if k == 0 {
        for r in 0..m {
            dst[r * dst_row_stride..][..n].iter_mut().for_each(|x| {
                *x = if dst_scale == 0.0 {
                    0.0
                } else {
                    *x * dst_scale
                }
            });
        }
        return;
    }
    // SAFETY: every index the product touches is within the slices (checked above), and `dst`
    // is exclusively borrowed.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_row_stride as isize,
            dst_scale != 0.0,
            lhs.data.as_ptr(),
            lhs.col_stride as isize,
            lhs.row_stride as isize,
            rhs.data.as_ptr(),
            rhs.col_stride as isize,
            rhs.row_stride as isize,
            dst_scale,
            product_scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltakv_contract::rng::Rng;

    #[test]
    fn matches_naive_product_with_transposes_and_accumulation() {
        let mut rng = Rng::new(3);
        let (m, k, n) = (37, 65, 19);
        let a = rng.normal_vec(m * k, 1.0);
        let b = rng.normal_vec(n * k, 1.0); // stored n x k, used transposed
        let mut dst = rng.normal_vec(m * n, 1.0);
        let old = dst.clone();
        matmul(
            &mut dst,
            n,
            MatRef::rows(&a, m, k, k),
            MatRef::rows(&b, n, k, k).t(),
            0.5,
            -2.0,
        );
        for r in 0..m {
            for c in 0..n {
                let dot: f64 = (0..k)
                    .map(|i| f64::from(a[r * k + i]) * f64::from(b[c * k + i]))
                    .sum();
                let want = 0.5 * f64::from(old[r * n + c]) - 2.0 * dot;
                assert!((f64::from(dst[r * n + c]) - want).abs() < 1e-3, "({r},{c})");
            }
        }
    }
}

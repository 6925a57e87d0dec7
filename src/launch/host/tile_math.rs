//! The small dense operations of the tile loops, written so the compiler vectorises them (eight
//! independent partial sums break the sequential dependency of a plain fold).

/// `a · b` in f32.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut lanes = [0f32; 8];
    let (a_body, a_tail) = a.split_at(a.len() - a.len() % 8);
    let (b_body, b_tail) = b.split_at(a_body.len());
    for (x, y) in a_body.chunks_exact(8).zip(b_body.chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum += x * y;
    }
    sum
}

/// `y += alpha * x`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y *= alpha`.
pub fn scale(alpha: f32, y: &mut [f32]) {
    for yi in y {
        *yi *= alpha;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_match_plain_loops() {
        for n in [0usize, 1, 7, 8, 9, 64, 88, 130] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - plain).abs() < 1e-4, "n = {n}");
            let mut y = b.clone();
            axpy(2.0, &a, &mut y);
            for i in 0..n {
                assert_eq!(y[i], b[i] + 2.0 * a[i]);
            }
        }
    }
}

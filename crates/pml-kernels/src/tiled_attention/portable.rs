//! The tile kernels in plain loops: the fallback of the AVX2 ones on other CPUs and head sizes,
//! and their reference in the tests. Same contracts as [`super::avx2`].

use super::{HEADER, PANEL};

pub(super) fn score_rows(queries: &[f32], panels: &[f32], d: usize, scores: &mut [f32]) {
    let rows = queries.len() / d.max(1);
    let width = scores.len() / rows.max(1);
    for (query, scores) in queries.chunks_exact(d).zip(scores.chunks_exact_mut(width)) {
        for (p, scores) in scores.chunks_exact_mut(PANEL).enumerate() {
            let panel = &panels[p * d * PANEL..][..d * PANEL];
            scores.fill(0.0);
            for (&q, keys) in query.iter().zip(panel.chunks_exact(PANEL)) {
                for (score, &k) in scores.iter_mut().zip(keys) {
                    *score += q * k;
                }
            }
        }
    }
}

pub(super) fn weigh_rows(
    (weights, width, n): (&[f32], usize, usize),
    (values, base, v_stride): (&[f32], usize, usize),
    d: usize,
    out: &mut [f32],
) {
    let stride = d + HEADER;
    for (weights, out) in weights.chunks_exact(width).zip(out.chunks_mut(stride)) {
        let out = &mut out[HEADER..][..d];
        out.fill(0.0);
        for (j, &weight) in weights[..n].iter().enumerate() {
            for (o, &v) in out.iter_mut().zip(&values[base + j * v_stride..][..d]) {
                *o += weight * v;
            }
        }
    }
}

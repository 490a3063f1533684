//! The native CPU path: the same answers as the kernels, computed with multi-threaded GEMM.

use ndarray::{Array1, Array2, ArrayView2, Axis, Zip};

use crate::distance::{Distance, DistanceConfig};
use crate::error::Result;
use crate::triplets::{CountMethod, Problem, Writer};

/// Squared norm of every row.
pub(crate) fn sq_norms(x: ArrayView2<'_, f32>) -> Array1<f32> {
    x.map_axis(Axis(1), |row| row.dot(&row))
}

/// Scale factors `1 / max(|x|, 1e-12)` from squared norms when normalising, else exactly 1.
pub(crate) fn inv_norms(n2: &Array1<f32>, cfg: &DistanceConfig) -> Array1<f32> {
    if cfg.normalizes() {
        n2.mapv(|v| 1.0 / v.sqrt().max(1e-12))
    } else {
        Array1::ones(n2.len())
    }
}

/// The metric from a (scaled) dot product and the two (scaled) squared norms: the epilogue of
/// `shaders/distance_tile.wgsl`, clamping included.
#[inline]
pub(crate) fn finish(distance: Distance, q2: f32, r2: f32, dot: f32) -> f32 {
    match distance {
        Distance::Euclidean => (q2 + r2 - 2.0 * dot).max(0.0).sqrt(),
        Distance::SquaredEuclidean => (q2 + r2 - 2.0 * dot).max(0.0),
        Distance::Cosine | Distance::DotProduct => dot,
    }
}

/// The distance matrix `(q, n)`; same formula and clamping as `shaders/distance_tile.wgsl`,
/// with the dot products from ndarray's (matrixmultiply, threaded) GEMM.
pub(crate) fn pairwise_distances(
    queries: ArrayView2<'_, f32>,
    refs: ArrayView2<'_, f32>,
    cfg: &DistanceConfig,
) -> Array2<f32> {
    let (q2, r2) = (sq_norms(queries), sq_norms(refs));
    let mut dots = queries.dot(&refs.t());
    let (iq, ir) = (inv_norms(&q2, cfg), inv_norms(&r2, cfg));
    // One pass over the GEMM output: scaling and the metric's epilogue together, in the
    // kernel's order of operations.
    Zip::from(dots.rows_mut())
        .and(&q2)
        .and(&iq)
        .for_each(|mut row, &q2, &iq| {
            let q2 = q2 * iq * iq;
            Zip::from(&mut row)
                .and(&r2)
                .and(&ir)
                .for_each(|d, &r2, &ir| *d = finish(cfg.distance, q2, r2 * ir * ir, *d * iq * ir));
        });
    dots
}

/// Anchors per block whose distance rows are computed together.
const ANCHOR_BLOCK: usize = 256;

/// The native twin of the triplet kernels: per anchor, its ascending positive and negative
/// lists, then each (positive, negative) pair through the rule, in (a, p, n) order. Counts
/// when `writer` is `None`.
pub(crate) fn triplets(problem: &Problem<'_>, writer: Option<Writer<'_>>) -> Result<u64> {
    let (b, m) = (problem.set.labels.len(), problem.set.ref_labels.len());
    let similarity = problem.distance.distance.is_similarity();
    let mut writer = writer;
    let mut counted = 0u64;
    let refs = problem.set.host_refs("mine_triplets")?;
    let (mut pos, mut neg, mut kept, mut sorted) = (
        Vec::with_capacity(m),
        Vec::with_capacity(m),
        Vec::with_capacity(m),
        Vec::with_capacity(m),
    );
    for a0 in (0..b).step_by(ANCHOR_BLOCK) {
        let rows = ANCHOR_BLOCK.min(b - a0);
        let dist = problem.set.queries.zip(refs).map(|(q, r)| {
            pairwise_distances(
                q.slice(ndarray::s![a0..a0 + rows, ..]),
                r,
                &problem.distance,
            )
        });
        for a in a0..a0 + rows {
            problem.set.lists_of(a, &mut pos, &mut neg);
            let row = dist.as_ref().map(|d| d.row(a - a0));
            let sorting = problem.count_method != CountMethod::Scan;
            if let (None, Some(row), true) = (writer.as_ref(), row, sorting) {
                // Counting only: sort the negatives' values once, then two binary searches
                // per positive (as the kernels do) instead of a scan.
                sorted.clear();
                sorted.extend(neg.iter().map(|&n| row[n as usize]));
                sorted.sort_unstable_by(f32::total_cmp);
                for &p in &pos {
                    counted += problem
                        .rule
                        .count_sorted(&sorted, row[p as usize], similarity);
                }
                continue;
            }
            for &p in &pos {
                let negatives: &[u32] = match row {
                    None => &neg,
                    Some(row) => {
                        let ap = row[p as usize];
                        kept.clear();
                        kept.extend(
                            neg.iter()
                                .copied()
                                .filter(|&n| problem.rule.keeps(ap, row[n as usize], similarity)),
                        );
                        &kept
                    }
                };
                match writer.as_mut() {
                    None => counted += negatives.len() as u64,
                    Some(w) => {
                        w.block(a as u32, p, negatives);
                        if w.stopped() {
                            return Ok(writer.map_or(0, Writer::finish));
                        }
                    }
                }
            }
        }
    }
    Ok(match writer {
        Some(w) => w.finish(),
        None => counted,
    })
}

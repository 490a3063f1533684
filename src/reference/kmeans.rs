//! Reference for [`crate::kmeans`]: Lloyd's algorithm written out with exact `f64` distances
//! over every point–centroid pair, the same seeded sample, initialisation and split of empty
//! clusters, and the same stopping rules.

#![allow(
    clippy::needless_range_loop,
    reason = "written with indices, as the algorithm is usually stated"
)]

use ndarray::{Array2, ArrayView2};

use crate::rng::SplitMix64;
use crate::KmeansConfig;

/// What the reference computes, and how close its decisions came to a tie.
#[derive(Debug, Clone)]
pub struct KmeansReference {
    /// `(k, d)`.
    pub centroids: Array2<f32>,
    /// `(n,)`: nearest final centroid, ties to the lower index.
    pub assignments: Vec<u32>,
    /// Sum of squared distances to the assigned centroids (every point, final centroids).
    pub inertia: f64,
    /// Centroid updates done.
    pub iterations: usize,
    /// The smallest gap, over every assignment made, between a point's nearest and second
    /// nearest centroid, relative to the distances involved. A `f32` implementation may
    /// decide otherwise where this is at the level of `f32` rounding.
    pub closest_call: f64,
    /// With a tolerance, the smallest gap between an update's gain and the tolerance's
    /// threshold, relative to the training points' summed squared norms (the scale of an
    /// `f32` objective's rounding); infinite without one.
    pub closest_stop: f64,
}

/// [`crate::kmeans`] of host points `(n, d)` with `cfg` (validated: `1 ≤ clusters ≤ n`).
pub fn kmeans(points: ArrayView2<'_, f32>, cfg: &KmeansConfig) -> KmeansReference {
    let n = points.nrows();
    let k = cfg.clusters;
    let cap = k.saturating_mul(cfg.max_points_per_centroid);
    let train_idx: Vec<usize> = if cfg.max_points_per_centroid > 0 && n > cap {
        SplitMix64::new(cfg.seed, 1).sample(n, cap)
    } else {
        (0..n).collect()
    };
    let m = train_idx.len();
    let mut centroids: Vec<Vec<f32>> = if m == k {
        train_idx.iter().map(|&i| points.row(i).to_vec()).collect()
    } else {
        let init = SplitMix64::new(cfg.seed, 2).sample(m, k);
        init.iter()
            .map(|&t| points.row(train_idx[t]).to_vec())
            .collect()
    };
    let mut split_rng = SplitMix64::new(cfg.seed, 3);
    // The size of the f32 objective's rounding: its distances' norm expansions.
    let scale = 1.0
        + train_idx
            .iter()
            .map(|&i| {
                points
                    .row(i)
                    .iter()
                    .map(|&v| f64::from(v).powi(2))
                    .sum::<f64>()
            })
            .sum::<f64>();
    let mut closest_call = f64::INFINITY;
    let mut closest_stop = f64::INFINITY;
    let mut previous: Option<(Vec<u32>, f64)> = None;
    let mut reuse: Option<(Vec<u32>, f64)> = None;
    let mut split_last = false;
    let mut iterations = 0;
    let max_updates = if m == k { 0 } else { cfg.max_iterations };
    while iterations < max_updates {
        let mut assigned = Vec::with_capacity(m);
        let mut objective = 0.0;
        for &i in &train_idx {
            let (c, dist, gap) = nearest(points.row(i).to_vec(), &centroids);
            assigned.push(c);
            objective += dist;
            closest_call = closest_call.min(gap);
        }
        let fixed = !split_last && previous.as_ref().map(|p| &p.0) == Some(&assigned);
        let flat = match &previous {
            Some((_, before)) if cfg.tolerance > 0.0 => {
                let gain = before - objective - cfg.tolerance * before;
                closest_stop = closest_stop.min(gain.abs() / scale);
                gain < 0.0
            }
            _ => false,
        };
        if fixed || flat {
            reuse = Some((assigned, objective));
            break;
        }
        // Means.
        let d = points.ncols();
        let mut sizes = vec![0.0f64; k];
        let mut sums = vec![vec![0.0f64; d]; k];
        for (t, &i) in train_idx.iter().enumerate() {
            let c = assigned[t] as usize;
            sizes[c] += 1.0;
            for j in 0..d {
                sums[c][j] += f64::from(points[[i, j]]);
            }
        }
        for c in 0..k {
            if sizes[c] > 0.0 {
                for j in 0..d {
                    centroids[c][j] = (sums[c][j] / sizes[c]) as f32;
                }
            }
        }
        // Faiss's split of empty clusters.
        split_last = false;
        let spare = m as f64 - k as f64;
        for c in 0..k {
            if sizes[c] != 0.0 {
                continue;
            }
            split_last = true;
            let mut j = 0;
            loop {
                let p = (sizes[j] - 1.0) / spare;
                if split_rng.unit() < p {
                    break;
                }
                j = (j + 1) % k;
            }
            for t in 0..d {
                let x = centroids[j][t];
                let eps = 1.0f32 / 1024.0;
                if t % 2 == 0 {
                    centroids[c][t] = x * (1.0 + eps);
                    centroids[j][t] = x * (1.0 - eps);
                } else {
                    centroids[c][t] = x * (1.0 - eps);
                    centroids[j][t] = x * (1.0 + eps);
                }
            }
            sizes[c] = sizes[j] / 2.0;
            sizes[j] -= sizes[c];
        }
        iterations += 1;
        previous = Some((assigned, objective));
    }
    let (assignments, inertia) = match reuse {
        Some(last) if m == n => last,
        _ => {
            let mut assigned = Vec::with_capacity(n);
            let mut total = 0.0;
            for row in points.outer_iter() {
                let (c, dist, gap) = nearest(row.to_vec(), &centroids);
                assigned.push(c);
                total += dist;
                closest_call = closest_call.min(gap);
            }
            (assigned, total)
        }
    };
    let d = points.ncols();
    let flat: Vec<f32> = centroids.concat();
    KmeansReference {
        centroids: Array2::from_shape_vec((k, d), flat).unwrap_or_else(|_| Array2::zeros((k, d))),
        assignments,
        inertia,
        iterations,
        closest_call,
        closest_stop,
    }
}

/// The nearest centroid of `x` (lowest index among equals), its squared distance, and the
/// relative gap to the runner-up (infinite with one centroid).
fn nearest(x: Vec<f32>, centroids: &[Vec<f32>]) -> (u32, f64, f64) {
    let dist = |c: &Vec<f32>| -> f64 {
        x.iter()
            .zip(c)
            .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
            .sum()
    };
    let mut best = (0u32, f64::INFINITY);
    let mut second = f64::INFINITY;
    for (c, centroid) in centroids.iter().enumerate() {
        let e = dist(centroid);
        if e < best.1 {
            second = best.1;
            best = (c as u32, e);
        } else if e < second {
            second = e;
        }
    }
    let scale = second.max(1.0) + x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>();
    (best.0, best.1, (second - best.1) / scale)
}

//! k-means (Lloyd's algorithm, initialised and repaired as Faiss does) whose assignment step is
//! the library's exact top-1 search, on any path: the clustering behind PML's NMI and AMI.
//!
//! As Faiss: `k` distinct random points as the first centroids; then, up to
//! `cfg.max_iterations` times, each training point is assigned its nearest centroid (squared
//! Euclidean), each centroid becomes the mean of its points, and each empty cluster takes half of
//! a populated one picked at random with probability growing with its size (Faiss's split,
//! centroids perturbed by ±1/1024). Finally every point is assigned to the final centroids. The
//! centroid update runs on the host, so rows on a device are read back once, and host points
//! are uploaded once on a wgpu context for every search. With `n = k` every point is its own
//! centroid.

use ndarray::{Array1, Array2, ArrayView2, Axis};

use crate::context::plan::Plan;
use crate::context::{ComputePath, Context};
use crate::data::device_rows::{DeviceRows, RowsView};
use crate::data::inputs::{self, Embeddings, Imports, Rows, NO_SLOT};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::{Distance, DistanceConfig};
use crate::ops::knn::{self, KnnConfig};
use crate::rng::SplitMix64;
use crate::runtime::memory::{HostReservation, Transfers};
use crate::runtime::pool::par_items;
use crate::runtime::transfer;

const OP: &str = "kmeans";

/// Faiss's relative perturbation of the two halves of a split cluster.
const SPLIT_EPS: f32 = 1.0 / 1024.0;

/// The random streams drawn from one seed.
const STREAM_SAMPLE: u64 = 1;
const STREAM_INIT: u64 = 2;
const STREAM_SPLIT: u64 = 3;

/// Settings of [`kmeans`]. Every field has a documented default.
///
/// # Example
/// ```
/// use wgpu_metric_learning::KmeansConfig;
/// let cfg = KmeansConfig { clusters: 100, ..Default::default() };
/// assert_eq!((cfg.max_iterations, cfg.seed, cfg.max_points_per_centroid), (20, 1234, 256));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct KmeansConfig {
    /// Clusters `k`, `1 ≤ k ≤ n`. Default 8 (scikit-learn's). [`crate::accuracy`] uses the
    /// number of query labels instead, as PML does.
    pub clusters: usize,
    /// Centroid updates at most (Faiss's `niter`). Default 20, what PML's
    /// `AccuracyCalculator` asks of Faiss.
    pub max_iterations: usize,
    /// Stop once an update lowers the objective (the training points' summed squared
    /// distance to their centroids) by less than `tolerance` times its previous value.
    /// Default 0: stop early only at a fixed point (no assignment changed, no cluster empty),
    /// where more updates would change nothing; Faiss always runs every iteration.
    pub tolerance: f64,
    /// Seed of the training sample, the initial centroids and the split of empty clusters:
    /// the result is a function of the points and the seed. Default 1234 (Faiss's).
    pub seed: u64,
    /// With more than `k · max_points_per_centroid` points, train on a random sample of that
    /// many (Faiss's subsampling, with Faiss's default of 256); the final assignment still
    /// covers every point. 0 trains on every point. Default 256.
    pub max_points_per_centroid: usize,
    /// Progress (point–centroid pairs compared, against the most the iterations could take)
    /// and cancellation, checked between iterations and inside each search. Default: none.
    pub hooks: Hooks,
}

impl Default for KmeansConfig {
    fn default() -> Self {
        Self {
            clusters: 8,
            max_iterations: 20,
            tolerance: 0.0,
            seed: 1234,
            max_points_per_centroid: 256,
            hooks: Hooks::default(),
        }
    }
}

/// The result of [`kmeans`].
///
/// # Example
/// ```
/// use wgpu_metric_learning::{kmeans, Context, KmeansConfig};
/// let x = ndarray::array![[0.0f32, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0]];
/// let cfg = KmeansConfig { clusters: 2, ..Default::default() };
/// let km = kmeans(&Context::native_cpu(None), &x, &cfg)?;
/// assert_eq!(km.assignments[0], km.assignments[1]);
/// assert_ne!(km.assignments[0], km.assignments[2]);
/// assert!((km.inertia - 1.0).abs() < 1e-6); // four points 0.5 from their centroids
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Kmeans {
    /// `(k, d)`: the final centroids.
    pub centroids: Array2<f32>,
    /// `(n,)`: each point's nearest final centroid (ties to the lower index), as PML reads
    /// them back from Faiss's index.
    pub assignments: Array1<u32>,
    /// `(n,)`: each point's squared Euclidean distance to its centroid.
    pub distances: Array1<f32>,
    /// The sum of `distances` (in `f64`).
    pub inertia: f64,
    /// Centroid updates done (fewer than `max_iterations` when it stopped early).
    pub iterations: usize,
    /// Where the searches ran.
    pub path: ComputePath,
    /// Host–device traffic of the call (zero on the native path).
    pub transfers: Transfers,
}

/// k-means of the points `(n, d)` into `cfg.clusters` clusters, as Faiss's `Kmeans` (the
/// clustering PML's `AccuracyCalculator` runs for NMI and AMI), each assignment an exact
/// top-1 [`knn`](crate::knn()) on `ctx`'s path under its budget: `O(iterations · n · k · d)`.
/// `points` may be a host array, device embeddings or a bank's rows (read back once).
///
/// # Errors
/// [`Error::Shape`] if `d = 0`; [`Error::NonFinite`] for a NaN or infinity;
/// [`Error::InvalidParameter`] for `clusters` outside `1..=n` or a negative or non-finite
/// `tolerance`, and for device embeddings as [`DeviceEmbeddings`](crate::DeviceEmbeddings)
/// says; [`Error::BudgetExceeded`] if its host memory (the rows read back from a device, the
/// training sample, the centroids and ~24 bytes per point) does not fit what the budget has
/// left; [`Error::OverBudget`] if not even one row of a search fits; [`Error::Cancelled`];
/// device errors.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{kmeans, Context, KmeansConfig};
/// let x = ndarray::Array2::from_shape_fn((300, 4), |(i, j)| ((i % 3) * 10 + j) as f32 + (i as f32 * 0.001));
/// let cfg = KmeansConfig { clusters: 3, ..Default::default() };
/// let km = kmeans(&Context::native_cpu(None), &x, &cfg)?;
/// assert_eq!(km.centroids.dim(), (3, 4));
/// // Rows 0, 3, 6, … share a cluster, as do 1, 4, 7, … and 2, 5, 8, …
/// assert!((0..300).all(|i| km.assignments[i] == km.assignments[i % 3]));
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn kmeans<'x>(
    ctx: &Context,
    points: impl Into<Embeddings<'x>>,
    cfg: &KmeansConfig,
) -> Result<Kmeans> {
    let points = points.into();
    let mut imports = Imports::call();
    let (found, transfers) = transfer::measure(|| {
        let check = |n: usize| check_config(cfg, n);
        let rows = inputs::prepare_rows(OP, ctx, points.reborrow(), check, &mut imports)?;
        let total = pairs_at_most(rows.nrows(), cfg);
        let report = Reporter::new(&cfg.hooks, OP, total);
        run(ctx, rows, cfg, &report)
    });
    let mut found = found?;
    found.transfers = transfers;
    Ok(found)
}

/// How [`kmeans`] would run with these arguments on `ctx`, computing nothing: the plan of one
/// assignment search (every point against the `k` centroids, in chunks under the budget) plus
/// its host memory and, on a device, the training rows it uploads once. The iterations run
/// that search again in the same memory.
///
/// # Errors
/// As [`kmeans`] for bad inputs and settings; [`Error::OverBudget`] or
/// [`Error::DeviceLimit`] when not even one row of a search fits.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{kmeans_plan, Context, KmeansConfig};
/// let x = ndarray::Array2::<f32>::zeros((10_000, 32));
/// let cfg = KmeansConfig { clusters: 100, ..Default::default() };
/// let plan = kmeans_plan(&Context::native_cpu(None), &x, &cfg)?;
/// assert!(plan.min_bytes <= plan.bytes);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn kmeans_plan<'x>(
    ctx: &Context,
    points: impl Into<Embeddings<'x>>,
    cfg: &KmeansConfig,
) -> Result<Plan> {
    let points = points.into();
    let mut imports = Imports::plan();
    let check = |n: usize| check_config(cfg, n);
    let rows = inputs::prepare_rows(OP, ctx, points.reborrow(), check, &mut imports)?;
    Ok(plan(ctx, rows, cfg)?.with_imports(imports.footprint()))
}

/// The rules of [`KmeansConfig`] for `n` points.
pub(crate) fn check_config(cfg: &KmeansConfig, n: usize) -> Result<()> {
    if cfg.clusters == 0 || cfg.clusters > n {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "clusters",
            value: format!("{} for {n} points", cfg.clusters),
            rule: "1 ≤ clusters ≤ the number of points",
        });
    }
    if !(cfg.tolerance.is_finite() && cfg.tolerance >= 0.0) {
        return Err(Error::InvalidParameter {
            op: OP,
            what: "tolerance",
            value: cfg.tolerance.to_string(),
            rule: "a finite number ≥ 0",
        });
    }
    Ok(())
}

/// The training points: all of them, or Faiss's sample of `k · max_points_per_centroid`.
fn training_size(n: usize, cfg: &KmeansConfig) -> usize {
    match cfg.clusters.checked_mul(cfg.max_points_per_centroid) {
        Some(cap) if cfg.max_points_per_centroid > 0 && n > cap => cap,
        _ => n,
    }
}

/// The point–centroid pairs compared when every iteration runs: the progress total.
pub(crate) fn pairs_at_most(n: usize, cfg: &KmeansConfig) -> u64 {
    let (k, train) = (cfg.clusters as u64, training_size(n, cfg) as u64);
    let updates = if train == k {
        0
    } else {
        cfg.max_iterations as u64
    };
    updates
        .saturating_mul(train)
        .saturating_add(n as u64)
        .saturating_mul(k)
}

/// The label of k-means' host memory in the budget.
const HOST: &str = "kmeans host rows and assignments";

/// Host bytes k-means holds besides its searches' scratch: rows read back from a device, the
/// training sample, the centroids and their sums, and the per-point vectors (assignments
/// and distances now and before, the cluster members, the search's exclusion slots).
pub(crate) fn host_bytes(n: usize, d: usize, resident: bool, cfg: &KmeansConfig) -> u64 {
    let (n64, d64, k) = (n as u64, d as u64, cfg.clusters as u64);
    let read_back = if resident { n64 * d64 * 4 } else { 0 };
    let train = training_size(n, cfg) as u64;
    let sample = if train < n64 { train * d64 * 4 } else { 0 };
    let centroids = k * d64 * 4 + crate::runtime::pool::threads() as u64 * d64 * 8 + k * 16;
    read_back + sample + centroids + n64 * 24
}

/// The assignment step's search: each point's nearest centroid by squared Euclidean
/// distance on the raw rows (Faiss's `IndexFlatL2`).
fn search_config(hooks: Hooks) -> KnnConfig {
    KnnConfig {
        k: 1,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        self_exclusion: inputs::SelfExclusion::Auto,
        hooks,
    }
}

/// How [`run`] would go on `ctx`: the plan of one of its searches (every point against the
/// centroids), plus its host memory and, on a device, its uploaded training rows.
pub(crate) fn plan(ctx: &Context, rows: Rows<'_>, cfg: &KmeansConfig) -> Result<Plan> {
    let (n, d) = inputs::embeddings_of(rows.reborrow()).dim();
    let centroids = Array2::<f32>::zeros((cfg.clusters, d));
    let search = search_config(Hooks::default());
    let mut plan = knn::knn_plan(
        ctx,
        inputs::embeddings_of(rows.reborrow()),
        &centroids,
        &search,
    )?;
    let mut host = host_bytes(n, d, matches!(rows, Rows::Resident(_)), cfg);
    if let (Some(gpu), Rows::Host(_)) = (ctx.gpu(), rows) {
        // The training rows, uploaded once for every search.
        let train = (training_size(n, cfg), d);
        host += DeviceRows::unallocated(OP, gpu, train)?.import_bytes().0;
    }
    plan.bytes += host;
    plan.min_bytes += host;
    Ok(plan)
}

/// [`kmeans`] over validated (and imported) rows, reporting into `report`.
pub(crate) fn run(
    ctx: &Context,
    rows: Rows<'_>,
    cfg: &KmeansConfig,
    report: &Reporter<'_>,
) -> Result<Kmeans> {
    let (n, k) = (rows.nrows(), cfg.clusters);
    let d = inputs::embeddings_of(rows.reborrow()).dim().1;
    let resident = matches!(rows, Rows::Resident(_));
    let host_held = host_bytes(n, d, resident, cfg);
    let _held = HostReservation::new(HOST, host_held, ctx.tracker())?;
    let host = inputs::host_rows(OP, ctx, rows.reborrow())?;
    // Faiss's sample of the training points, drawn before (and apart from) the centroids.
    let n_train = training_size(n, cfg);
    let sample: Option<Array2<f32>> = (n_train < n).then(|| {
        let picks = SplitMix64::new(cfg.seed, STREAM_SAMPLE).sample(n, n_train);
        host.select(Axis(0), &picks)
    });
    let (train_host, train_rows): (ArrayView2<'_, f32>, Rows<'_>) = match &sample {
        Some(s) => (s.view(), Rows::Host(s.view())),
        None => (host.view(), rows.reborrow()),
    };
    // On a device, host training points go up once for every search, not once per iteration.
    let uploaded = match (ctx.gpu(), train_rows) {
        (Some(gpu), Rows::Host(x)) => Some(gpu.settled(DeviceRows::upload(gpu, x))?),
        _ => None,
    };
    // What k-means holds while its searches run: a search too big for what is left names the
    // budget the whole call needs, as kmeans_plan's min_bytes does.
    let held = host_held + uploaded.as_ref().map_or(0, |r| r.import_bytes().0);
    // (The search names the budget it planned in, what was left: the call's is the whole.)
    let whole = |e: Error| match e {
        Error::OverBudget { op, required, .. } => Error::OverBudget {
            op,
            required: required.saturating_add(held),
            budget: ctx.tracker().stats().budget_bytes,
        },
        e => e,
    };
    let train_rows = match &uploaded {
        Some(on_device) => Rows::Resident(RowsView {
            rows: on_device,
            len: n_train,
        }),
        None => train_rows,
    };
    let mut centroids = if n_train == k {
        train_host.to_owned()
    } else {
        let picks = SplitMix64::new(cfg.seed, STREAM_INIT).sample(n_train, k);
        train_host.select(Axis(0), &picks)
    };
    let search = search_config(cfg.hooks.clone());
    let nobody = vec![NO_SLOT; n];
    let assign = |points: Rows<'_>, centroids: &Array2<f32>| -> Result<(Vec<u32>, Vec<f32>)> {
        report.check()?;
        let m = points.nrows();
        let part = report.part(m as u64 * k as u64);
        let found = knn::search_step(
            ctx,
            points,
            Embeddings::Host(centroids.view()),
            &search,
            // Never direct: k-means' searches stay the same GEMM whatever the chunk.
            (&nobody[..m], false),
            &part,
        )
        .map_err(whole)?;
        Ok((
            found.indices.column(0).to_vec(),
            found.scores.column(0).to_vec(),
        ))
    };
    let mut splits = SplitMix64::new(cfg.seed, STREAM_SPLIT);
    let mut previous: Option<(Vec<u32>, f64)> = None;
    let mut iterations = 0;
    // The last assignment, when it was made against the current centroids.
    let mut current: Option<(Vec<u32>, Vec<f32>)> = None;
    let updates = if n_train == k { 0 } else { cfg.max_iterations };
    let mut split_last = false;
    while iterations < updates {
        let (assigned, distances) = assign(train_rows.reborrow(), &centroids)?;
        let objective: f64 = distances.iter().map(|&x| f64::from(x)).sum();
        let fixed = !split_last && previous.as_ref().is_some_and(|(a, _)| *a == assigned);
        let flat = previous.as_ref().is_some_and(|&(_, before)| {
            cfg.tolerance > 0.0 && before - objective < cfg.tolerance * before
        });
        if fixed || flat {
            current = Some((assigned, distances));
            break;
        }
        let counts = update(&mut centroids, train_host, &assigned);
        split_last = split_empty(&mut centroids, counts, &mut splits);
        iterations += 1;
        previous = Some((assigned, objective));
    }
    // Faiss's index holds the final centroids; PML assigns every point against them.
    let (assigned, distances) = match current {
        Some(last) if sample.is_none() => last,
        // Every point: the training rows themselves when they were all of them.
        _ if sample.is_none() => assign(train_rows, &centroids)?,
        _ => assign(rows, &centroids)?,
    };
    // Iterations not run are progress all the same.
    report.add(pairs_at_most(n, cfg));
    let inertia = distances.iter().map(|&x| f64::from(x)).sum();
    Ok(Kmeans {
        centroids,
        assignments: Array1::from(assigned),
        distances: Array1::from(distances),
        inertia,
        iterations,
        path: ctx.path(),
        transfers: Transfers::default(),
    })
}

/// Each centroid becomes the mean of its points, summed in `f64` in row order (so the result
/// does not depend on the thread count); centroids without points stay as they are. Clusters
/// are spread over the threads, each reading only its own points. Returns the points per
/// centroid.
fn update(centroids: &mut Array2<f32>, points: ArrayView2<'_, f32>, assigned: &[u32]) -> Vec<f64> {
    let (k, d) = centroids.dim();
    // The rows of each cluster, ascending: a counting sort of the assignments.
    let mut starts = vec![0usize; k + 1];
    for &c in assigned {
        starts[c as usize + 1] += 1;
    }
    for c in 0..k {
        starts[c + 1] += starts[c];
    }
    let mut next = starts.clone();
    let mut members = vec![0u32; assigned.len()];
    for (row, &c) in assigned.iter().enumerate() {
        members[next[c as usize]] = row as u32;
        next[c as usize] += 1;
    }
    let means = par_items(
        crate::runtime::pool::threads(),
        k,
        || vec![0.0f64; d],
        |c, sum| {
            let rows = &members[starts[c]..starts[c + 1]];
            if rows.is_empty() {
                return None;
            }
            sum.fill(0.0);
            for &row in rows {
                let row = points.row(row as usize);
                // A contiguous row as a slice: the widening add then compiles to vector code.
                match row.as_slice() {
                    Some(xs) => sum
                        .iter_mut()
                        .zip(xs)
                        .for_each(|(s, &x)| *s += f64::from(x)),
                    None => sum
                        .iter_mut()
                        .zip(row)
                        .for_each(|(s, &x)| *s += f64::from(x)),
                }
            }
            let count = rows.len() as f64;
            Some(
                sum.iter()
                    .map(|&s| (s / count) as f32)
                    .collect::<Vec<f32>>(),
            )
        },
    );
    for (mut centroid, mean) in centroids.outer_iter_mut().zip(means) {
        if let Some(mean) = mean {
            centroid.assign(&ndarray::ArrayView1::from(&mean));
        }
    }
    (0..k).map(|c| (starts[c + 1] - starts[c]) as f64).collect()
}

/// Faiss's repair of empty clusters: each takes a copy of a cluster `j` picked, scanning from
/// 0 round and round, with probability `(size_j − 1) / (n − k)`; the two copies move apart by
/// ±1/1024 of each coordinate, and the size is shared as if split evenly. Needs `n > k`
/// (then some cluster has two points, and the scan ends). Returns whether any was empty.
fn split_empty(centroids: &mut Array2<f32>, mut sizes: Vec<f64>, rng: &mut SplitMix64) -> bool {
    let k = sizes.len();
    let spare: f64 = sizes.iter().map(|s| s - 1.0).sum();
    let mut any = false;
    for i in 0..k {
        if sizes[i] > 0.0 {
            continue;
        }
        any = true;
        let mut j = 0;
        while rng.unit() >= (sizes[j] - 1.0) / spare {
            j = (j + 1) % k;
        }
        for t in 0..centroids.ncols() {
            let x = centroids[[j, t]];
            let (up, down) = (x * (1.0 + SPLIT_EPS), x * (1.0 - SPLIT_EPS));
            let (a, b) = if t % 2 == 0 { (up, down) } else { (down, up) };
            centroids[[i, t]] = a;
            centroids[[j, t]] = b;
        }
        sizes[i] = sizes[j] / 2.0;
        sizes[j] -= sizes[i];
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Faiss's split, checked coordinate by coordinate: the empty cluster gets the picked
    /// centroid scaled by 1 ± 1/1024 (up on even coordinates), the picked one the opposite.
    #[test]
    fn split_copies_and_perturbs() {
        let original = ndarray::array![[1.0f32, 2.0, -3.0], [9.0, 9.0, 9.0], [4.0, -8.0, 16.0]];
        let mut centroids = original.clone();
        let mut rng = SplitMix64::new(5, STREAM_SPLIT);
        // Cluster 1 is empty; cluster 0 has one point (never picked), cluster 2 has five.
        assert!(split_empty(&mut centroids, vec![1.0, 0.0, 5.0], &mut rng));
        let eps = 1.0 / 1024.0;
        for t in 0..3 {
            let x = original[[2, t]];
            let (up, down) = (x * (1.0 + eps), x * (1.0 - eps));
            let (new, old) = if t % 2 == 0 { (up, down) } else { (down, up) };
            assert_eq!(centroids[[1, t]], new, "coordinate {t}");
            assert_eq!(centroids[[2, t]], old, "coordinate {t}");
        }
        assert_eq!(centroids.row(0), original.row(0));
        let mut unchanged = original.clone();
        assert!(!split_empty(&mut unchanged, vec![1.0, 2.0, 3.0], &mut rng));
        assert_eq!(unchanged, original);
    }

    /// The cluster to split is picked with probability growing with its size less one:
    /// sizes 1, 3 and 9 (spare 2 + 8) with cluster 3 empty pick cluster 2 most often and
    /// cluster 0 never.
    #[test]
    fn split_picks_by_size() {
        let mut picks = [0usize; 3];
        let mut rng = SplitMix64::new(17, STREAM_SPLIT);
        for _ in 0..4000 {
            let mut c = ndarray::array![[1.0f32], [2.0], [3.0], [0.5]];
            split_empty(&mut c, vec![1.0, 3.0, 9.0, 0.0], &mut rng);
            let picked = (0..3)
                .find(|&j| c[[j, 0]] != [1.0, 2.0, 3.0][j])
                .expect("one changed");
            picks[picked] += 1;
        }
        assert_eq!(picks[0], 0, "{picks:?}");
        // The scan from 0 favours low indices a little; the larger cluster still dominates.
        assert!(picks[2] > 2 * picks[1], "{picks:?}");
    }
}

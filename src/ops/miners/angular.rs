//! PML's `AngularMiner` (Wang et al., 2017): triplets whose negative sees the anchor and the
//! positive under a wide angle from their centre.
//!
//! The norms are those of `torch.nn.functional.pairwise_distance` (`‖x − y + 10⁻⁶‖`) on the
//! raw embeddings, as PML computes them (its distance object only passes the type check);
//! the angle is compared in `f32` radians, as torch compares.
//!
//! Each anchor's centres `c` become query rows of the distance tile (GPU or native) against
//! the references, in blocks of whole rows, so neither the triplets nor the `(centres, m)`
//! matrix exist beyond one block; `‖n − c‖` comes from the tile's expansion (computed
//! directly on the native path for at most 25 centres and references), which can round
//! differently from PML's direct difference for a triplet within about `10⁻⁶` of the
//! angle. Device-resident inputs are read back to form the centres. [`crate::mine_plan`]
//! plans blocks of anchor rows; this miner runs as many centre rows as there are positive
//! pairs, so it makes more blocks of the same size than that plan counts.

use std::hash::Hash;

use ndarray::ArrayView2;

use crate::context::Context;
use crate::data::device_rows::Rows;
use crate::data::inputs::{host_refs, host_rows, unimported, Imports, MiningSet, SelfExclusion};
use crate::error::{Error, Result};
use crate::hooks::{Hooks, Reporter};
use crate::metric::{Distance, DistanceConfig};
use crate::ops::distance::{for_each_row_block, Job};
use crate::ops::triplets::{list_sizes, Triplets};
use crate::runtime::transfer;

use super::rows::{prepare_miner, BLOCK_FLOATS};
use super::{sealed, MinerConfig};

/// The `eps` that `torch.nn.functional.pairwise_distance` adds to every difference.
const PAIRWISE_EPS: f32 = 1e-6;

/// `AngularMiner` settings; the default angle is PML's. PML accepts only its default distance
/// (Euclidean, normalised) and never uses it to normalise: the miner measures raw embeddings.
///
/// # Example
/// ```
/// assert_eq!(wgpu_metric_learning::AngularConfig::default().angle, 20.0);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AngularConfig {
    /// The threshold in degrees: triplets whose angle is wider are kept. Default 20.
    pub angle: f64,
    /// Which reference is each anchor itself. Default [`SelfExclusion::Auto`] (its own row
    /// when the references are the queries).
    pub self_exclusion: SelfExclusion,
    /// Progress (centre–reference pairs compared) and cancellation. Default: none.
    pub hooks: Hooks,
}

impl Default for AngularConfig {
    fn default() -> Self {
        Self {
            angle: 20.0,
            self_exclusion: SelfExclusion::Auto,
            hooks: Hooks::default(),
        }
    }
}

/// PML `AngularMiner` over `queries` `(b, d)` and `refs` `(m, d)`: of all valid triplets
/// `(a, p, n)`, in PML's order (anchor, positive, negative, ascending), those with
/// `atan(‖a − p‖ / (2·‖n − c‖)) > angle`, `c = (a + p)/2`, on the raw embeddings as PML
/// computes them (module docs). Cost: one distance tile of the `(positive pairs, m)` centres
/// against the references, in blocks of whole rows: no triplet list, no full matrix.
///
/// # Errors
/// As [`crate::mine_triplets`]; [`Error::InvalidParameter`] for a non-finite angle.
///
/// # Example
/// ```
/// use ndarray::array;
/// use wgpu_metric_learning::{angular_triplets, AngularConfig, Context, MiningSet};
/// let labels = array![0, 0, 1, 2];
/// let x = array![[0.0f32, 0.0], [2.0, 0.0], [1.0, 0.5], [9.0, 9.0]];
/// let t = angular_triplets(&Context::native_cpu(None), &MiningSet::new(&x, &labels), None, &AngularConfig::default())?;
/// // Row 2 sits between rows 0 and 1: a wide angle. Row 9, 9 is far: a narrow one.
/// assert_eq!(t.indices, array![[0u32, 1, 2], [1, 0, 2]]);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
pub fn angular_triplets<L: Hash + Eq + Copy>(
    ctx: &Context,
    queries: &MiningSet<'_, L>,
    refs: Option<&MiningSet<'_, L>>,
    cfg: &AngularConfig,
) -> Result<Triplets> {
    const OP: &str = "angular_triplets";
    let mut imports = Imports::call();
    let set = prepare_miner(ctx, queries, refs, cfg, &mut imports)?;
    let (Some(q_rows), Some(r_rows)) = (set.queries, set.refs) else {
        return Err(unimported(OP));
    };
    // torch compares a float32 tensor with a Python float in float32.
    let threshold = cfg.angle.to_radians() as f32;
    let raw = DistanceConfig {
        distance: Distance::Euclidean,
        normalize: false,
    };
    let (b, m) = (set.labels.len(), set.ref_labels.len());
    let (mined, transfers) = transfer::measure(|| -> Result<Vec<u32>> {
        let queries = host_rows(OP, ctx, q_rows)?;
        let refs = host_refs(OP, ctx, r_rows.reborrow())?;
        let d = queries.ncols();
        // Centres per block: whole rows of distances and of centres within one host block.
        let block = (BLOCK_FLOATS / m.max(d).max(1)).max(1);
        // Each anchor with a negative has a centre per positive.
        let centres_total: u64 = list_sizes(&set)
            .filter(|&(_, negatives)| negatives > 0)
            .map(|(positives, _)| positives)
            .sum();
        let report = Reporter::new(&cfg.hooks, OP, centres_total * m as u64);
        let mut out = Vec::new();
        let mut chunk = Chunk::new(block.min(centres_total as usize), d);
        let flush = Flush {
            ctx,
            set: &set,
            refs: r_rows.reborrow(),
            raw: &raw,
            report: &report,
            threshold,
            m,
        };
        let (mut positives, mut negatives) = (Vec::with_capacity(m), Vec::with_capacity(m));
        for a in 0..b {
            set.lists_of(a, &mut positives, &mut negatives);
            if negatives.is_empty() {
                continue;
            }
            for &p in &positives {
                if chunk.len() == block {
                    chunk.flush(&flush, &mut out)?;
                }
                chunk.push(a as u32, p, queries.row(a), refs.row(p as usize));
            }
        }
        chunk.flush(&flush, &mut out)?;
        Ok(out)
    });
    let mut transfers = transfers;
    transfers.add(set.imported);
    Triplets::from_flat(OP, ctx, mined?, transfers)
}

/// What a block of centres is compared with, and how.
struct Flush<'f, 'a> {
    ctx: &'f Context,
    set: &'f crate::data::inputs::Labelled<'a>,
    refs: crate::data::inputs::Embeddings<'f>,
    raw: &'f DistanceConfig,
    report: &'f Reporter<'f>,
    threshold: f32,
    m: usize,
}

/// Centres waiting for their distances: `(anchor, positive, ‖a − p + eps‖)` and the rows
/// `(a + p)/2 − eps`, so that the tile's `‖n − row‖` is torch's `‖n − c + eps‖`.
struct Chunk {
    pairs: Vec<(u32, u32, f32)>,
    rows: Vec<f32>,
    d: usize,
}

impl Chunk {
    fn new(capacity: usize, d: usize) -> Self {
        Self {
            pairs: Vec::with_capacity(capacity),
            rows: Vec::with_capacity(capacity * d),
            d,
        }
    }

    fn len(&self) -> usize {
        self.pairs.len()
    }

    fn push(
        &mut self,
        a: u32,
        p: u32,
        anchor: ndarray::ArrayView1<'_, f32>,
        positive: ndarray::ArrayView1<'_, f32>,
    ) {
        let mut squares = 0.0f32;
        for (&x, &y) in anchor.iter().zip(positive.iter()) {
            let diff = x - y + PAIRWISE_EPS;
            squares += diff * diff;
            self.rows.push((x + y) / 2.0 - PAIRWISE_EPS);
        }
        self.pairs.push((a, p, squares.sqrt()));
    }

    /// Compares the centres with every reference and keeps each anchor's negatives whose
    /// angle passes, then empties the chunk.
    fn flush(&mut self, f: &Flush<'_, '_>, out: &mut Vec<u32>) -> Result<()> {
        const OP: &str = "angular_triplets";
        if self.pairs.is_empty() {
            return Ok(());
        }
        let centres =
            ArrayView2::from_shape((self.pairs.len(), self.d), &self.rows).map_err(|e| {
                Error::Internal {
                    op: OP,
                    message: format!("centres are not whole rows: {e}"),
                }
            })?;
        let part = f.report.part(self.pairs.len() as u64 * f.m as u64);
        let job = Job {
            op: OP,
            ctx: f.ctx,
            queries: Rows::Host(centres),
            cfg: f.raw,
            max_rows: self.pairs.len(),
            report: &part,
        };
        let (mut positives, mut negatives) = (Vec::new(), Vec::with_capacity(f.m));
        let mut listed = None;
        let pairs = &self.pairs;
        let mut on_block = |r0: usize, block: ArrayView2<'_, f32>| -> Result<()> {
            for (i, distances) in block.rows().into_iter().enumerate() {
                let (a, p, ap) = pairs[r0 + i];
                if listed != Some(a) {
                    f.set.lists_of(a as usize, &mut positives, &mut negatives);
                    listed = Some(a);
                }
                for &n in &negatives {
                    let nc = distances[n as usize];
                    if (ap / (2.0 * nc)).atan() > f.threshold {
                        out.extend([a, p, n]);
                    }
                }
            }
            Ok(())
        };
        for_each_row_block(&job, f.refs.reborrow(), &mut on_block)?;
        self.pairs.clear();
        self.rows.clear();
        Ok(())
    }
}

impl sealed::Sealed for AngularConfig {}
impl MinerConfig for AngularConfig {
    runs!(Triplets, angular_triplets);
    fn op(&self) -> &'static str {
        "angular_triplets"
    }
    fn self_exclusion(&self) -> &SelfExclusion {
        &self.self_exclusion
    }
    fn distance(&self) -> Option<&DistanceConfig> {
        const EUCLIDEAN_RAW: DistanceConfig = DistanceConfig {
            distance: Distance::Euclidean,
            normalize: false,
        };
        Some(&EUCLIDEAN_RAW)
    }
    fn check(&self) -> Result<()> {
        if self.angle.is_finite() {
            Ok(())
        } else {
            Err(Error::InvalidParameter {
                op: self.op(),
                what: "angle",
                value: self.angle.to_string(),
                rule: "must be finite",
            })
        }
    }
    fn hooks(&self) -> &Hooks {
        &self.hooks
    }
}

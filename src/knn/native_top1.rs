//! The native exact top-1 search (`k = 1`: k-means' assignment step, 1-NN accuracy): the dot
//! products of a few query rows against a panel of references accumulate in registers, and
//! each finished micro-tile folds straight into the rows' best `(key, index)`, lane by lane.
//! Unlike the general path (a GEMM into a cache-sized block, then a selection pass over it),
//! no dot product is written to memory, and each chunk of references is packed once per
//! query block rather than once per GEMM call.
//!
//! The answer is the general path's, bit for bit given the same dot products: the same
//! metric expression, the same keys (`key_of`: `-0` as `+0`, NaNs where their bits put
//! them), ties to the lower index. Each dot product is one chain of multiply-adds in
//! dimension order, fused where the CPU has FMA.

use std::ops::Range;

use ndarray::ArrayView2;

use crate::distance::native::{finish, Norms};
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::metric::Distance;

/// The most query rows of any kernel's micro-tile. With two vectors of references per row,
/// a tile of `R` rows keeps `2R` accumulators in registers, beside the two reference vectors
/// and a broadcast: `R = 6` with 16 vector registers (AVX2, or SSE2 with half-width panels),
/// `R = 12` with 32 (AVX-512); NEON's 32 registers hold four per row of 16, so `R = 6`.
const MAX_ROWS: usize = 12;
/// The widest panel of any instruction set (AVX-512: two vectors of 16): chunks hold a
/// multiple of it, so every kernel's panels tile them exactly.
const MAX_WIDTH: usize = 32;
/// Bytes of one packed chunk of references: small enough to stay in a core's L2 cache (256 KiB
/// or more on x86-64 and Arm cores of the last decade) while every group of query rows
/// streams through it.
const CHUNK_BYTES: usize = 256 * 1024;
/// Query rows per block: every chunk of references is packed once per block, so blocks are
/// long enough for packing to cost ~2 % of the multiply-adds; a row's state is only 8 bytes.
pub(super) const QUERY_BLOCK: usize = 2048;

/// References per packed chunk at dimension `d`: [`CHUNK_BYTES`] of them, at least one
/// [`MAX_WIDTH`] panel.
pub(super) fn chunk_refs(d: usize) -> usize {
    (CHUNK_BYTES / (4 * d.max(1)) / MAX_WIDTH).max(1) * MAX_WIDTH
}

/// Bytes of scratch one thread holds for query blocks of `rows` rows at dimension `d`: the
/// packed chunk and its references' two factors, one transposed group of query rows, and
/// each row's best.
pub(super) fn scratch_bytes(rows: usize, d: usize) -> u64 {
    let c = chunk_refs(d) as u64;
    4 * (c * d as u64 + 2 * c + (MAX_ROWS * d) as u64) + 16 * rows as u64
}

/// A row's best so far: a signed key (ordered as `key_of`'s unsigned one) and an index.
type Best = (i32, u32);

/// No element yet: every element, whatever its key, beats it (by index when the key is the
/// largest, as the general path keeps such an element too).
const NONE: Best = (i32::MAX, EMPTY_INDEX);

/// `key_of(o, false)` with its top bit flipped, as `i32`: a signed compare of these orders as
/// an unsigned compare of the keys, and it is a few vector instructions.
#[inline(always)]
fn signed_key(o: f32) -> i32 {
    let bits = match o.to_bits() {
        0x8000_0000 => 0,
        b => b,
    } as i32;
    bits ^ ((bits >> 31) & 0x7FFF_FFFF)
}

/// The unsigned key of a signed one.
fn unsigned_key(key: i32) -> u32 {
    (key as u32) ^ 0x8000_0000
}

/// One thread's buffers, reused across its blocks.
pub(super) struct Scratch {
    packed: Vec<f32>,
    ref_scale: Vec<f32>,
    ref_sq: Vec<f32>,
    group: Vec<f32>,
}

impl Scratch {
    pub(super) fn new(d: usize) -> Self {
        let c = chunk_refs(d);
        Self {
            packed: vec![0.0; c * d],
            ref_scale: vec![0.0; c],
            ref_sq: vec![0.0; c],
            group: vec![0.0; MAX_ROWS * d],
        }
    }
}

/// One block of a search: query rows `rows` against references `shard`.
pub(super) struct Block<'a> {
    pub(super) queries: ArrayView2<'a, f32>,
    pub(super) refs: ArrayView2<'a, f32>,
    pub(super) norms: &'a (Norms, Norms),
    pub(super) excluded: &'a [u32],
    pub(super) rows: Range<usize>,
    pub(super) shard: Range<usize>,
}

/// The factors of one group's rows: scale, squared norm and excluded reference.
struct GroupRows<const R: usize> {
    scale: [f32; R],
    sq: [f32; R],
    skip: [u32; R],
}

/// Every row's best reference of the block as `(key, index)`, one pair per row; a row that
/// sees no reference gets `(u32::MAX, EMPTY_INDEX)`, as the general path pads it.
pub(super) fn search_block(
    block: &Block<'_>,
    distance: Distance,
    scratch: &mut Scratch,
) -> Vec<[u32; 2]> {
    // One instance per metric, so the per-element work has no branch on it; the expressions
    // are the general path's (`feed_row`'s), so equal dot products give equal keys.
    match distance {
        Distance::Cosine | Distance::DotProduct => {
            dispatch(block, scratch, |d, qs, _, rs, _| -(d * qs * rs))
        }
        Distance::Euclidean => dispatch(block, scratch, |d, qs, qq, rs, rq| {
            finish(Distance::Euclidean, qq, rq, d * qs * rs)
        }),
        Distance::SquaredEuclidean => dispatch(block, scratch, |d, qs, qq, rs, rq| {
            finish(Distance::SquaredEuclidean, qq, rq, d * qs * rs)
        }),
    }
}

/// The oriented metric (smaller is better) from `(dot, query scale, query squared norm,
/// reference scale, reference squared norm)`.
trait Oriented: Fn(f32, f32, f32, f32, f32) -> f32 + Copy {}
impl<F: Fn(f32, f32, f32, f32, f32) -> f32 + Copy> Oriented for F {}

/// The widest kernel this CPU runs, chosen at run time.
fn dispatch(block: &Block<'_>, scratch: &mut Scratch, oriented: impl Oriented) -> Vec<[u32; 2]> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU (and the OS, which std's detection checks) supports AVX-512F.
            return unsafe { block_avx512(block, scratch, oriented) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the CPU supports AVX2 and FMA.
            return unsafe { block_avx2(block, scratch, oriented) };
        }
        run_block::<6, 8, false>(block, scratch, oriented)
    }
    // NEON and its fused multiply-add are part of the AArch64 baseline.
    #[cfg(target_arch = "aarch64")]
    {
        run_block::<6, 16, true>(block, scratch, oriented)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        run_block::<6, 8, false>(block, scratch, oriented)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn block_avx512(
    block: &Block<'_>,
    scratch: &mut Scratch,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    run_block::<12, 32, true>(block, scratch, oriented)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(block: &Block<'_>, scratch: &mut Scratch, oriented: impl Oriented) -> Vec<[u32; 2]> {
    run_block::<6, 16, true>(block, scratch, oriented)
}

/// The block in chunks of references (outer) and groups of `R ≤` [`MAX_ROWS`] query rows
/// (inner), with panels of `W` references; `FMA` fuses each multiply-add.
#[inline(always)]
fn run_block<const R: usize, const W: usize, const FMA: bool>(
    block: &Block<'_>,
    scratch: &mut Scratch,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    let (queries, refs) = (block.queries, block.refs);
    let d = queries.ncols();
    let (q_norms, r_norms) = block.norms;
    let rows = block.rows.clone();
    let mut best = vec![NONE; rows.len()];
    let chunk = scratch.ref_scale.len();
    for c0 in block.shard.clone().step_by(chunk) {
        let cols = chunk.min(block.shard.end - c0);
        let panels = cols.div_ceil(W);
        pack::<W>(refs, c0..c0 + cols, &mut scratch.packed[..panels * W * d]);
        for (j, (s, q)) in scratch.ref_scale[..panels * W]
            .iter_mut()
            .zip(&mut scratch.ref_sq[..panels * W])
            .enumerate()
        {
            // Padding lanes are masked by index; any finite factor does.
            (*s, *q) = match j < cols {
                true => (r_norms.scale[c0 + j], r_norms.sq[c0 + j]),
                false => (0.0, 0.0),
            };
        }
        let span = (c0 as u32, (c0 + cols) as u32);
        let group_buffer = &mut scratch.group[..R * d];
        for (g, best) in best.chunks_mut(R).enumerate() {
            // A last group of fewer rows repeats its last row; those results are dropped.
            let first = rows.start + g * R;
            let row = |r: usize| first + r.min(best.len() - 1);
            for (t, col) in group_buffer.chunks_exact_mut(R).enumerate() {
                for (r, v) in col.iter_mut().enumerate() {
                    *v = queries[[row(r), t]];
                }
            }
            let group = GroupRows {
                scale: std::array::from_fn(|r| q_norms.scale[row(r)]),
                sq: std::array::from_fn(|r| q_norms.sq[row(r)]),
                skip: std::array::from_fn(|r| block.excluded[row(r)]),
            };
            let mut tile: [Best; R] = std::array::from_fn(|r| match r < best.len() {
                true => best[r],
                false => NONE,
            });
            let factors = (
                &scratch.ref_scale[..panels * W],
                &scratch.ref_sq[..panels * W],
            );
            fold_chunk::<R, W, FMA>(
                group_buffer,
                &scratch.packed[..panels * W * d],
                factors,
                &group,
                span,
                &mut tile,
                oriented,
            );
            best.copy_from_slice(&tile[..best.len()]);
        }
    }
    best.iter()
        .map(|&(key, index)| [unsigned_key(key), index])
        .collect()
}

/// Packs references `range` into panels of `W`: `out[(p·d + t)·W + j]` is component `t` of
/// reference `range.start + p·W + j`, zero past the range's end.
#[inline(always)]
fn pack<const W: usize>(refs: ArrayView2<'_, f32>, range: Range<usize>, out: &mut [f32]) {
    let d = refs.ncols();
    for (p, panel) in out.chunks_exact_mut(d * W).enumerate() {
        let (panel, _) = panel.as_chunks_mut::<W>();
        let start = range.start + p * W;
        let cols = W.min(range.end - start);
        if cols < W {
            panel.iter_mut().for_each(|lanes| lanes[cols..].fill(0.0));
        }
        for j in 0..cols {
            for (lanes, &v) in panel.iter_mut().zip(refs.row(start + j)) {
                if let Some(lane) = lanes.get_mut(j) {
                    *lane = v;
                }
            }
        }
    }
}

/// The group's `R` rows (`group[t·R + r]` is component `t` of row `r`) against one packed chunk
/// whose first reference has index `span.0`, folding every reference below `span.1` other
/// than a row's excluded one into that row's `best`.
#[inline(always)]
fn fold_chunk<const R: usize, const W: usize, const FMA: bool>(
    group: &[f32],
    packed: &[f32],
    (ref_scale, ref_sq): (&[f32], &[f32]),
    rows: &GroupRows<R>,
    (first, end): (u32, u32),
    best: &mut [Best; R],
    oriented: impl Oriented,
) {
    let d = group.len() / R;
    let (columns, _) = group.as_chunks::<R>();
    let (ref_scale, _) = ref_scale.as_chunks::<W>();
    let (ref_sq, _) = ref_sq.as_chunks::<W>();
    // Each lane keeps its own best, starting from the row's: references reach a lane in index
    // order, so a strictly smaller key wins, and an equal key only beats the empty best.
    let mut keys: [[i32; W]; R] = std::array::from_fn(|r| [best[r].0; W]);
    let mut indices: [[u32; W]; R] = std::array::from_fn(|r| [best[r].1; W]);
    let panels = packed.chunks_exact(d * W).zip(ref_scale).zip(ref_sq);
    for (p, ((panel, rs), rq)) in panels.enumerate() {
        let mut acc = [[0.0f32; W]; R];
        let (panel, _) = panel.as_chunks::<W>();
        for (b, a) in panel.iter().zip(columns) {
            // Copies, so that the compiler keeps them (and `acc`) in vector registers.
            let (a, b) = (*a, *b);
            for r in 0..R {
                for j in 0..W {
                    acc[r][j] = match FMA {
                        true => a[r].mul_add(b[j], acc[r][j]),
                        false => a[r] * b[j] + acc[r][j],
                    };
                }
            }
        }
        let base = first + (p * W) as u32;
        for r in 0..R {
            let (qs, qq, skip) = (rows.scale[r], rows.sq[r], rows.skip[r]);
            for j in 0..W {
                let index = base + j as u32;
                let key = signed_key(oriented(acc[r][j], qs, qq, rs[j], rq[j]));
                let (k, i) = (keys[r][j], indices[r][j]);
                let wins = (key < k) | ((key == k) & (index < i));
                let take = wins & (index < end) & (index != skip);
                keys[r][j] = if take { key } else { k };
                indices[r][j] = if take { index } else { i };
            }
        }
    }
    for r in 0..R {
        for j in 0..W {
            best[r] = best[r].min((keys[r][j], indices[r][j]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::knn_select::key_of;

    #[test]
    fn signed_keys_order_as_the_unsigned_keys() {
        let values = [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7FFF_FFFF),
            f32::from_bits(0xFFFF_FFFF),
            f32::from_bits(0x7F80_0001),
        ];
        for &a in &values {
            assert_eq!(unsigned_key(signed_key(a)), key_of(a, false), "{a:?}");
            for &b in &values {
                let by_key = key_of(a, false).cmp(&key_of(b, false));
                assert_eq!(signed_key(a).cmp(&signed_key(b)), by_key, "{a:?} {b:?}");
            }
        }
    }

    /// Every kernel shape (AVX-512's, AVX2's and NEON's, the portable one), called directly
    /// whatever this CPU runs, against a brute-force selection: rows not a multiple of any
    /// tile, a shard starting off a panel and crossing chunks (32 references each at
    /// d = 2 048), self-exclusion, and small integers so that every dot product is exact.
    #[test]
    fn every_kernel_shape_finds_the_brute_force_best() {
        use crate::metric::DistanceConfig;
        use ndarray::Array2;
        let (q, n, d) = (29, 203, 2048);
        let value = |i: usize, j: usize| ((i * 7 + j * 3 + i * j) % 5) as f32 - 2.0;
        let queries = Array2::from_shape_fn((q, d), |(i, j)| value(i, j));
        let refs = Array2::from_shape_fn((n, d), |(i, j)| value(i + 3, j));
        let cfg = DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        };
        let norms = (
            Norms::new(queries.view(), &cfg),
            Norms::new(refs.view(), &cfg),
        );
        let excluded: Vec<u32> = (0..q as u32).map(|i| i * 7).collect();
        let (rows, shard) = (2..q, 5..n);
        let block = Block {
            queries: queries.view(),
            refs: refs.view(),
            norms: &norms,
            excluded: &excluded,
            rows: rows.clone(),
            shard: shard.clone(),
        };
        let truth: Vec<[u32; 2]> = rows
            .map(|i| {
                let score = |j: usize| {
                    let dot = queries.row(i).dot(&refs.row(j));
                    finish(cfg.distance, norms.0.sq[i], norms.1.sq[j], dot)
                };
                let best = shard.clone().filter(|&j| j as u32 != excluded[i]);
                let best = best.map(|j| (key_of(score(j), false), j as u32)).min();
                best.map_or([u32::MAX, EMPTY_INDEX], |(k, j)| [k, j])
            })
            .collect();
        let oriented = |d: f32, qs: f32, qq: f32, rs: f32, rq: f32| {
            finish(Distance::SquaredEuclidean, qq, rq, d * qs * rs)
        };
        let mut scratch = Scratch::new(d);
        assert_eq!(
            run_block::<12, 32, true>(&block, &mut scratch, oriented),
            truth
        );
        assert_eq!(
            run_block::<6, 16, true>(&block, &mut scratch, oriented),
            truth
        );
        assert_eq!(
            run_block::<6, 8, false>(&block, &mut scratch, oriented),
            truth
        );
        assert_eq!(search_block(&block, cfg.distance, &mut scratch), truth);
    }

    #[test]
    fn chunks_hold_whole_panels_of_every_width() {
        for d in [1, 2, 3, 127, 128, 129, 2048, 8192, 1 << 20] {
            let c = chunk_refs(d);
            assert!(c >= MAX_WIDTH && c.is_multiple_of(MAX_WIDTH), "d {d}: {c}");
            assert!(c == MAX_WIDTH || 4 * c * d <= CHUNK_BYTES, "d {d}: {c}");
        }
    }
}

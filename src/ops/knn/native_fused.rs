//! The native fused search for small `k` (`k ≤` [`MAX_K`]: k-means' assignment step at
//! `k = 1`, kNN evaluation's usual `k`): the dot products of a few query rows against a panel
//! of references accumulate in registers, and each finished micro-tile is selected from at
//! once. At `k = 1` each lane keeps its own best `(key, index)`, reduced per row at the end of
//! a chunk; above, a row of a tile whose scores all miss its bound costs one compare, and the
//! rest goes to the general path's candidate lists. Unlike the general path (a GEMM into a
//! cache-sized block, then a selection pass over it), no dot product is written to memory,
//! and each chunk of references is packed once per block of queries rather than once per
//! GEMM call.
//!
//! The answer is the general path's, bit for bit: each dot product is summed as its GEMM
//! (matrixmultiply) sums it, one chain of multiply-adds per 256 dimensions (fused where
//! matrixmultiply fuses them) with the slices added in order, and then the same metric
//! expression, the same keys (`key_of`: `-0` as `+0`, NaNs where their bits put them) and
//! ties to the lower index. (A build where ndarray uses BLAS sums differently; only the last
//! bits of the scores differ then.)

use std::ops::Range;

use ndarray::ArrayView2;

use super::candidates::{admitted, shrink, Candidates};
use crate::hooks::Reporter;
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::metric::Distance;
use crate::ops::distance::native::{finish, Norms};

/// The largest `k` the fused search takes: above it, each row's candidate list outgrows what
/// a block of [`QUERY_BLOCK`] rows should hold, and the general path's 256-row blocks win.
pub(super) const MAX_K: usize = 128;

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
/// long enough for packing to cost ~2 % of the multiply-adds; a row's state is 8 bytes at
/// `k = 1`, its candidate list above.
pub(super) const QUERY_BLOCK: usize = 2048;

/// References per packed chunk at dimension `d` among `n`: [`CHUNK_BYTES`] of them (at least
/// one [`MAX_WIDTH`] panel), or all `n` (in whole panels) when they take less.
pub(super) fn chunk_refs(n: usize, d: usize) -> usize {
    let most = (CHUNK_BYTES / (4 * d.max(1)) / MAX_WIDTH).max(1);
    most.min(n.div_ceil(MAX_WIDTH).max(1)) * MAX_WIDTH
}

/// Bytes of scratch one thread holds for query blocks of `rows` rows against `n` references
/// of dimension `d`, and `k`: the packed chunk and its references' two factors, one
/// transposed group of query rows, each row's best (at `k = 1`) or candidate list, and the
/// block's answer.
pub(super) fn scratch_bytes(rows: usize, (n, d): (usize, usize), k: usize) -> u64 {
    let c = chunk_refs(n, d) as u64;
    let packed = 4 * (c * d as u64 + 2 * c + (MAX_ROWS * d) as u64);
    let per_row = match k {
        1 => 8,
        k => 8 * Candidates::capacity(k) as u64 + std::mem::size_of::<Candidates>() as u64,
    };
    packed + rows as u64 * (per_row + 8 * k as u64)
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
    /// For references `(n, d)`.
    pub(super) fn new(d: usize, n: usize) -> Self {
        let c = chunk_refs(n, d);
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
    /// Told of each chunk's pairs; the block stops early once it says cancelled.
    pub(super) report: &'a Reporter<'a>,
}

/// Every row's best `k` references of the block as `(key, index)` pairs, `k` per row in no
/// particular order; a row that sees fewer gets `(u32::MAX, EMPTY_INDEX)` for the rest, as
/// the general path pads it.
pub(super) fn search_block(
    block: &Block<'_>,
    distance: Distance,
    k: usize,
    scratch: &mut Scratch,
) -> Vec<[u32; 2]> {
    // One instance per metric, so the per-element work has no branch on it; the expressions
    // are the general path's (`feed_row`'s), so equal dot products give equal keys.
    match distance {
        Distance::Cosine | Distance::DotProduct => {
            dispatch(block, scratch, k, |d, qs, _, rs, _| -(d * qs * rs))
        }
        Distance::Euclidean => dispatch(block, scratch, k, |d, qs, qq, rs, rq| {
            finish(Distance::Euclidean, qq, rq, d * qs * rs)
        }),
        Distance::SquaredEuclidean => dispatch(block, scratch, k, |d, qs, qq, rs, rq| {
            finish(Distance::SquaredEuclidean, qq, rq, d * qs * rs)
        }),
    }
}

/// The oriented metric (smaller is better) from `(dot, query scale, query squared norm,
/// reference scale, reference squared norm)`.
trait Oriented: Fn(f32, f32, f32, f32, f32) -> f32 + Copy {}
impl<F: Fn(f32, f32, f32, f32, f32) -> f32 + Copy> Oriented for F {}

/// The widest kernel this CPU runs, chosen at run time.
fn dispatch(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    #[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
    {
        use crate::runtime::simd::{detected, isa, Isa};
        // As matrixmultiply picks its kernels (with FMA from AVX2 on), so that both paths
        // fuse the same multiply-adds.
        match isa() {
            // SAFETY: `isa` names AVX-512F + FMA only where the CPU (and the OS, which std's
            // detection checks) supports them.
            Isa::Avx512 => unsafe { block_avx512(block, scratch, k, oriented) },
            // SAFETY: as above, AVX2 + FMA.
            Isa::Avx2 => unsafe { block_avx2(block, scratch, k, oriented) },
            // Capped below a CPU whose matrixmultiply fuses (`WML_NATIVE_ISA`): the baseline
            // tile with fused multiply-adds (in the vectors the `fma` feature brings) keeps
            // the general path's bits.
            // SAFETY: `detected` says the CPU has AVX2 and FMA.
            Isa::Baseline if detected() >= Isa::Avx2 => unsafe {
                block_fma(block, scratch, k, oriented)
            },
            Isa::Baseline => select::<6, 8, false>(block, scratch, k, oriented),
        }
    }
    // NEON and its fused multiply-add are part of the AArch64 baseline.
    #[cfg(target_arch = "aarch64")]
    {
        select::<6, 16, true>(block, scratch, k, oriented)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "x86", target_arch = "aarch64")))]
    {
        select::<6, 8, false>(block, scratch, k, oriented)
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
#[target_feature(enable = "avx512f,fma")]
fn block_avx512(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    select::<12, 32, true>(block, scratch, k, oriented)
}

#[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
#[target_feature(enable = "avx2,fma")]
fn block_avx2(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    select::<6, 16, true>(block, scratch, k, oriented)
}

#[cfg(any(target_arch = "x86_64", target_arch = "x86"))]
#[target_feature(enable = "fma")]
fn block_fma(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    select::<6, 8, true>(block, scratch, k, oriented)
}

/// The block with tiles of `R` rows × `W` references, selected by lanes (`k = 1`) or by
/// candidate lists.
#[inline(always)]
fn select<const R: usize, const W: usize, const FMA: bool>(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    let rows = block.rows.len();
    match k {
        1 => run_block::<R, W, FMA, _>(block, scratch, oriented, Top1::<R, W>::new(rows)),
        k => run_block::<R, W, FMA, _>(block, scratch, oriented, TopK::new(rows, k)),
    }
}

/// How tiles of oriented scores become each row's best `k`.
trait Select<const R: usize, const W: usize> {
    /// Before a group of block rows `g0..g0 + len` (`len ≤ R`) meets a chunk's panels.
    fn start(&mut self, g0: usize, len: usize);
    /// One tile: `scores[r][j]` is row `g0 + r`'s oriented score of reference `base + j`,
    /// which counts if `j < valid` and it is not the row's `skip`.
    fn tile(&mut self, scores: &[[f32; W]; R], base: u32, valid: u32, skip: &[u32; R]);
    /// After the group has met every panel of the chunk.
    fn finish(&mut self);
    /// `k` `(key, index)` pairs per row, padded.
    fn pairs(self) -> Vec<[u32; 2]>;
}

/// `k = 1`: each lane of a group's tile keeps its own best, starting from the row's, reduced
/// to the row's at the end of the chunk. References reach a lane in index order, so a
/// strictly smaller key wins, and an equal key only beats the empty best.
struct Top1<const R: usize, const W: usize> {
    best: Vec<Best>,
    keys: [[i32; W]; R],
    indices: [[u32; W]; R],
    group: Range<usize>,
}

impl<const R: usize, const W: usize> Top1<R, W> {
    fn new(rows: usize) -> Self {
        Self {
            best: vec![NONE; rows],
            keys: [[NONE.0; W]; R],
            indices: [[NONE.1; W]; R],
            group: 0..0,
        }
    }
}

impl<const R: usize, const W: usize> Select<R, W> for Top1<R, W> {
    #[inline(always)]
    fn start(&mut self, g0: usize, len: usize) {
        self.group = g0..g0 + len;
        for r in 0..R {
            let best = self.best.get(g0 + r).filter(|_| r < len).copied();
            let (key, index) = best.unwrap_or(NONE);
            (self.keys[r], self.indices[r]) = ([key; W], [index; W]);
        }
    }

    #[inline(always)]
    #[allow(
        clippy::needless_range_loop,
        reason = "four arrays indexed alike: plain indices compile to vector code"
    )]
    fn tile(&mut self, scores: &[[f32; W]; R], base: u32, valid: u32, skip: &[u32; R]) {
        for r in 0..R {
            for j in 0..W {
                // Padding lanes are masked by position: their index may not exist.
                let index = base.wrapping_add(j as u32);
                let key = signed_key(scores[r][j]);
                let (k, i) = (self.keys[r][j], self.indices[r][j]);
                let wins = (key < k) | ((key == k) & (index < i));
                let take = wins & ((j as u32) < valid) & (index != skip[r]);
                self.keys[r][j] = if take { key } else { k };
                self.indices[r][j] = if take { index } else { i };
            }
        }
    }

    #[inline(always)]
    fn finish(&mut self) {
        let (keys, indices) = (&self.keys, &self.indices);
        for (r, best) in self.best[self.group.clone()].iter_mut().enumerate() {
            for j in 0..W {
                *best = (*best).min((keys[r][j], indices[r][j]));
            }
        }
    }

    fn pairs(self) -> Vec<[u32; 2]> {
        let pair = |&(key, index): &Best| [unsigned_key(key), index];
        self.best.iter().map(pair).collect()
    }
}

/// `k > 1`: the general path's candidate list per row, fed from the tiles. A row's tile
/// where no score reaches the list's bound costs one compare of `W` lanes.
struct TopK {
    lists: Vec<Candidates>,
    k: usize,
    group: Range<usize>,
}

impl TopK {
    fn new(rows: usize, k: usize) -> Self {
        Self {
            lists: (0..rows).map(|_| Candidates::new(k)).collect(),
            k,
            group: 0..0,
        }
    }
}

impl<const R: usize, const W: usize> Select<R, W> for TopK {
    #[inline(always)]
    fn start(&mut self, g0: usize, len: usize) {
        self.group = g0..g0 + len;
    }

    #[inline(always)]
    fn tile(&mut self, scores: &[[f32; W]; R], base: u32, valid: u32, skip: &[u32; R]) {
        let k = self.k;
        let rows = self.lists[self.group.clone()].iter_mut();
        for ((list, scores), &skip) in rows.zip(scores).zip(skip) {
            // Most tiles admit nothing and cost one compare of W ≤ 32 lanes.
            let mut hits = admitted(scores, list.bound);
            while hits != 0 {
                let j = hits.trailing_zeros();
                hits &= hits - 1;
                let index = base.wrapping_add(j);
                // `offer` tests the bound again, as a shrink may have tightened it.
                let o = scores[j as usize];
                if j < valid && index != skip && list.admits(o) {
                    list.offer(o, index, k);
                }
            }
        }
    }

    #[inline(always)]
    fn finish(&mut self) {}

    fn pairs(self) -> Vec<[u32; 2]> {
        let mut pairs = Vec::with_capacity(self.lists.len() * self.k);
        for mut list in self.lists {
            shrink(&mut list.list, self.k);
            list.list.resize(self.k, [u32::MAX, EMPTY_INDEX]);
            pairs.extend_from_slice(&list.list);
        }
        pairs
    }
}

/// The block in chunks of references (outer) and groups of `R ≤` [`MAX_ROWS`] query rows
/// (inner), with panels of `W` references (`FMA` fuses each multiply-add); every tile's
/// oriented scores go to `select`.
#[inline(always)]
fn run_block<const R: usize, const W: usize, const FMA: bool, S: Select<R, W>>(
    block: &Block<'_>,
    scratch: &mut Scratch,
    oriented: impl Oriented,
    mut select: S,
) -> Vec<[u32; 2]> {
    let (queries, refs) = (block.queries, block.refs);
    let d = queries.ncols();
    let (q_norms, r_norms) = block.norms;
    let rows = block.rows.clone();
    let chunk = scratch.ref_scale.len();
    for c0 in block.shard.clone().step_by(chunk) {
        // The caller turns a cancelled search into an error and drops this block's answer.
        if block.report.cancelled() {
            break;
        }
        let cols = chunk.min(block.shard.end - c0);
        let panels = cols.div_ceil(W);
        let div = r_norms.div.get(c0..c0 + cols).unwrap_or(&[]);
        pack::<W>(
            refs,
            (c0..c0 + cols, div),
            &mut scratch.packed[..panels * W * d],
        );
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
        let packed = &scratch.packed[..panels * W * d];
        let (ref_scale, _) = scratch.ref_scale[..panels * W].as_chunks::<W>();
        let (ref_sq, _) = scratch.ref_sq[..panels * W].as_chunks::<W>();
        let group = &mut scratch.group[..R * d];
        for g0 in (0..rows.len()).step_by(R) {
            // A last group of fewer rows repeats its last row; `select` drops those.
            let len = R.min(rows.len() - g0);
            let row = |r: usize| rows.start + g0 + r.min(len - 1);
            // Each row divided by its norm as it is read ([`Norms::dividing`]; 1 when not
            // normalising, and nothing to divide by without divisors).
            let div: [Option<f32>; R] = std::array::from_fn(|r| q_norms.div.get(row(r)).copied());
            for (t, col) in group.chunks_exact_mut(R).enumerate() {
                for (r, v) in col.iter_mut().enumerate() {
                    let x = queries[[row(r), t]];
                    *v = div[r].map_or(x, |by| x / by);
                }
            }
            let (columns, _) = group.as_chunks::<R>();
            let qs: [f32; R] = std::array::from_fn(|r| q_norms.scale[row(r)]);
            let qq: [f32; R] = std::array::from_fn(|r| q_norms.sq[row(r)]);
            let skip: [u32; R] = std::array::from_fn(|r| block.excluded[row(r)]);
            select.start(g0, len);
            let panels = packed.chunks_exact(d * W).zip(ref_scale).zip(ref_sq);
            for (p, ((panel, rs), rq)) in panels.enumerate() {
                let acc = dot_tile::<R, W, FMA>(panel, columns);
                let scores: [[f32; W]; R] = std::array::from_fn(|r| {
                    std::array::from_fn(|j| oriented(acc[r][j], qs[r], qq[r], rs[j], rq[j]))
                });
                let valid = (cols - p * W).min(W) as u32;
                select.tile(&scores, (c0 + p * W) as u32, valid, &skip);
            }
            select.finish();
        }
        block.report.add((rows.len() * cols) as u64);
    }
    select.pairs()
}

/// The general path's GEMM (matrixmultiply) sums the dimension in slices of this many, each
/// a chain of its own, then adds each slice's sums to the total: doing the same keeps the two
/// paths' dot products, and so their answers, bit for bit equal.
const GEMM_SLICE: usize = 256;

/// The `R × W` dot products of a group's rows (`columns[t][r]`: component `t` of row `r`)
/// and one packed panel (`panel[t·W + j]`: component `t` of reference `j`): per slice of
/// [`GEMM_SLICE`] dimensions one chain of multiply-adds in dimension order, the slices added
/// in order.
#[inline(always)]
fn dot_tile<const R: usize, const W: usize, const FMA: bool>(
    panel: &[f32],
    columns: &[[f32; R]],
) -> [[f32; W]; R] {
    let (panel, _) = panel.as_chunks::<W>();
    let mut slices = panel.chunks(GEMM_SLICE).zip(columns.chunks(GEMM_SLICE));
    let Some((panel, columns)) = slices.next() else {
        return [[0.0; W]; R];
    };
    let mut total = dot_chain::<R, W, FMA>(panel, columns);
    for (panel, columns) in slices {
        let part = dot_chain::<R, W, FMA>(panel, columns);
        for r in 0..R {
            for j in 0..W {
                total[r][j] += part[r][j];
            }
        }
    }
    total
}

/// One chain of multiply-adds per dot product over the given dimensions.
#[inline(always)]
fn dot_chain<const R: usize, const W: usize, const FMA: bool>(
    panel: &[[f32; W]],
    columns: &[[f32; R]],
) -> [[f32; W]; R] {
    let mut acc = [[0.0f32; W]; R];
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
    acc
}

/// Packs references `range` into panels of `W`: `out[(p·d + t)·W + j]` is component `t` of
/// reference `range.start + p·W + j` divided by its `div` (none: as it is), zero past the
/// range's end.
#[inline(always)]
fn pack<const W: usize>(
    refs: ArrayView2<'_, f32>,
    (range, div): (Range<usize>, &[f32]),
    out: &mut [f32],
) {
    let d = refs.ncols();
    for (p, panel) in out.chunks_exact_mut(d * W).enumerate() {
        let (panel, _) = panel.as_chunks_mut::<W>();
        let start = range.start + p * W;
        let cols = W.min(range.end - start);
        if cols < W {
            panel.iter_mut().for_each(|lanes| lanes[cols..].fill(0.0));
        }
        for j in 0..cols {
            let by = div.get(p * W + j).copied();
            for (lanes, &v) in panel.iter_mut().zip(refs.row(start + j)) {
                if let Some(lane) = lanes.get_mut(j) {
                    *lane = match by {
                        Some(by) => v / by,
                        None => v,
                    };
                }
            }
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
    /// whatever this CPU runs, at k = 1, 5 and one more than a row sees, against a brute-force
    /// selection: rows not a multiple of any tile, a shard starting off a panel and crossing
    /// chunks (32 references each at d = 2 048), self-exclusion, padding, and small integers
    /// so that every dot product is exact.
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
        let hooks = crate::hooks::Hooks::default();
        let report = Reporter::new(&hooks, "test", (rows.len() * shard.len()) as u64);
        let block = Block {
            queries: queries.view(),
            refs: refs.view(),
            norms: &norms,
            excluded: &excluded,
            rows: rows.clone(),
            shard: shard.clone(),
            report: &report,
        };
        // Each row's best k by (key, index), padded, sorted; the kernels' lists sorted too.
        let truth = |k: usize| -> Vec<[u32; 2]> {
            let mut pairs = Vec::new();
            for i in rows.clone() {
                let score = |j: usize| {
                    let dot = queries.row(i).dot(&refs.row(j));
                    finish(cfg.distance, norms.0.sq[i], norms.1.sq[j], dot)
                };
                let seen = shard.clone().filter(|&j| j as u32 != excluded[i]);
                let mut row: Vec<[u32; 2]> =
                    seen.map(|j| [key_of(score(j), false), j as u32]).collect();
                row.sort_unstable();
                row.resize(k, [u32::MAX, EMPTY_INDEX]);
                pairs.extend_from_slice(&row[..k]);
            }
            pairs
        };
        let sorted = |mut pairs: Vec<[u32; 2]>, k: usize| {
            pairs.chunks_mut(k).for_each(|row| row.sort_unstable());
            pairs
        };
        let oriented = |d: f32, qs: f32, qq: f32, rs: f32, rq: f32| {
            finish(Distance::SquaredEuclidean, qq, rq, d * qs * rs)
        };
        let mut scratch = Scratch::new(d, n);
        for k in [1, 5, shard.len()] {
            let want = truth(k);
            let s = &mut scratch;
            let found = [
                select::<12, 32, true>(&block, s, k, oriented),
                select::<6, 16, true>(&block, s, k, oriented),
                select::<6, 8, false>(&block, s, k, oriented),
                search_block(&block, cfg.distance, k, s),
            ];
            for (shape, pairs) in found.into_iter().enumerate() {
                assert_eq!(sorted(pairs, k), want, "k {k}, shape {shape}");
            }
        }
    }

    #[test]
    fn chunks_hold_whole_panels_of_every_width() {
        for d in [1, 2, 3, 127, 128, 129, 2048, 8192, 1 << 20] {
            for n in [1, 31, 33, 1000, 1 << 30] {
                let c = chunk_refs(n, d);
                assert!(c >= MAX_WIDTH && c.is_multiple_of(MAX_WIDTH), "d {d}: {c}");
                assert!(c == MAX_WIDTH || 4 * c * d <= CHUNK_BYTES, "d {d}: {c}");
                assert!(c < n + MAX_WIDTH, "n {n}, d {d}: {c}");
            }
        }
    }

    /// The plan counts what the fused search allocates: the scratch's buffers, and per row
    /// its best or candidate list and its answer.
    #[test]
    fn scratch_bytes_are_the_allocations() {
        for (n, d) in [(10, 3), (1000, 128), (100_000, 128), (5, 4096)] {
            let s = Scratch::new(d, n);
            let buffers = 4 * (s.packed.len() + s.ref_scale.len() + s.ref_sq.len() + s.group.len());
            assert_eq!(scratch_bytes(0, (n, d), 1), buffers as u64);
            assert_eq!(scratch_bytes(10, (n, d), 1), buffers as u64 + 10 * 16);
            let list = 8 * Candidates::capacity(7) + std::mem::size_of::<Candidates>();
            assert_eq!(
                scratch_bytes(10, (n, d), 7),
                (buffers + 10 * (list + 8 * 7)) as u64
            );
        }
    }
}

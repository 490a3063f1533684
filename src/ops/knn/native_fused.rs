//! The native fused search for small `k` (`k ≤` [`MAX_K`]: k-means' assignment step at
//! `k = 1`, kNN evaluation's usual `k`): the dot products of a few query rows against a panel
//! of references accumulate in registers, and each finished micro-tile is selected from at
//! once. Each row has a bound (its best score at `k = 1`, its candidate list's worst kept
//! one above), and a tile none of whose scores reaches its rows' bounds, the common case,
//! costs a compare and an or per vector and one branch; the rows of the others go to their
//! best or to the general path's candidate lists. Unlike the general path (a GEMM into a
//! cache-sized block, then a selection pass over it), no dot product is written to memory,
//! each chunk of references is packed once per block of queries rather than once per GEMM
//! call, and the block's query rows are divided and transposed once per block.
//!
//! The tile's epilogue is written as plain loops over copied arrays: the compiler turned
//! `array::from_fn` there, and factors read through references, into a call per row and
//! scalar code, which cost a fifth of the search on an AVX2 EPYC (BENCHMARKS.md, issue 40).
//!
//! The answer is the general path's, bit for bit: each dot product is summed as its GEMM
//! (`runtime::gemm`) sums it, one chain of multiply-adds per 256 dimensions (fused where the
//! CPU has FMA) with the slices added in order, and then the same metric expression, the
//! same keys (`key_of`: `-0` as `+0`, NaNs where their bits put them) and ties to the lower
//! index.

use std::ops::Range;

use ndarray::ArrayView2;

use super::candidates::{admits, admitted_lanes, shrink, Candidates};
use crate::hooks::Reporter;
use crate::kernels::knn_select::EMPTY_INDEX;
use crate::metric::Distance;
use crate::ops::distance::native::{finish, Norms};
use crate::runtime::gemm::dot_chain;

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
/// long enough for packing to cost ~2 % of the multiply-adds; a row's state is 12 bytes at
/// `k = 1` (its best and bound), its candidate list above; its transposed row is `4·d`.
pub(super) const QUERY_BLOCK: usize = 2048;

/// References per packed chunk at dimension `d` among `n`: [`CHUNK_BYTES`] of them (at least
/// one [`MAX_WIDTH`] panel), or all `n` (in whole panels) when they take less.
pub(super) fn chunk_refs(n: usize, d: usize) -> usize {
    let most = (CHUNK_BYTES / (4 * d.max(1)) / MAX_WIDTH).max(1);
    most.min(n.div_ceil(MAX_WIDTH).max(1)) * MAX_WIDTH
}

/// Bytes of scratch one thread holds for query blocks of `rows` rows against `n` references
/// of dimension `d`, and `k`: the packed chunk and its references' two factors, the block's
/// query rows transposed by groups, each row's best and bound (at `k = 1`) or candidate list,
/// and the block's answer.
pub(super) fn scratch_bytes(rows: usize, (n, d): (usize, usize), k: usize) -> u64 {
    let c = chunk_refs(n, d) as u64;
    let packed = 4 * (c * d as u64 + 2 * c + grouped_len(rows, d) as u64);
    let per_row = match k {
        1 => 12,
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

/// Floats of a block of `rows` query rows of dimension `d` transposed by groups: whole groups
/// of every kernel's `R` (each divides [`MAX_ROWS`]).
fn grouped_len(rows: usize, d: usize) -> usize {
    rows.next_multiple_of(MAX_ROWS) * d
}

/// One thread's buffers, reused across its blocks.
pub(super) struct Scratch {
    packed: Vec<f32>,
    ref_scale: Vec<f32>,
    ref_sq: Vec<f32>,
    /// The block's query rows, divided by their norms and transposed once per block by
    /// groups of `R` (`[group][t][r]`), rather than once per chunk of references.
    grouped: Vec<f32>,
}

impl Scratch {
    /// For query blocks of at most `rows` rows against references `(n, d)`.
    pub(super) fn new(d: usize, n: usize, rows: usize) -> Self {
        let c = chunk_refs(n, d);
        Self {
            packed: vec![0.0; c * d],
            ref_scale: vec![0.0; c],
            ref_sq: vec![0.0; c],
            grouped: vec![0.0; grouped_len(rows, d)],
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
        // As the general path's GEMM picks its kernels (with FMA from AVX2 on), so that both
        // paths fuse the same multiply-adds.
        match isa() {
            // SAFETY: `isa` names AVX-512F + FMA only where the CPU (and the OS, which std's
            // detection checks) supports them.
            Isa::Avx512 => unsafe { block_avx512(block, scratch, k, oriented) },
            // SAFETY: as above, AVX2 + FMA.
            Isa::Avx2 => unsafe { block_avx2(block, scratch, k, oriented) },
            // Capped below a CPU with FMA (`WML_NATIVE_ISA`): the baseline
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

/// The block with tiles of `R` rows × `W` references, selected into each row's best
/// (`k = 1`) or candidate list.
#[inline(always)]
fn select<const R: usize, const W: usize, const FMA: bool>(
    block: &Block<'_>,
    scratch: &mut Scratch,
    k: usize,
    oriented: impl Oriented,
) -> Vec<[u32; 2]> {
    let rows = block.rows.len();
    match k {
        1 => run_block::<R, W, FMA, _>(block, scratch, oriented, Top1::new(rows)),
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
    /// `k` `(key, index)` pairs per row, padded.
    fn pairs(self) -> Vec<[u32; 2]>;
}

/// `k = 1`: each row's best `(key, index)` and the oriented score it was kept with, as a
/// bound that a tile must reach before its lanes are looked at (as [`TopK`]'s lists). Tiles
/// arrive in index order, so an equal key only wins by a lower index, which it has only
/// against the empty best.
struct Top1 {
    best: Vec<Best>,
    bounds: Vec<f32>,
    group: Range<usize>,
}

impl Top1 {
    fn new(rows: usize) -> Self {
        Self {
            best: vec![NONE; rows],
            bounds: vec![f32::INFINITY; rows],
            group: 0..0,
        }
    }
}

impl<const R: usize, const W: usize> Select<R, W> for Top1 {
    #[inline(always)]
    fn start(&mut self, g0: usize, len: usize) {
        self.group = g0..g0 + len;
    }

    #[inline(always)]
    fn tile(&mut self, scores: &[[f32; W]; R], base: u32, valid: u32, skip: &[u32; R]) {
        let (g0, len) = (self.group.start, self.group.len());
        // Copied, with a plain loop: `array::from_fn` here stayed a call per tile (AVX-512).
        let mut bounds = [0.0; R];
        for (copy, &bound) in bounds.iter_mut().zip(&self.bounds[self.group.clone()]) {
            *copy = bound;
        }
        visit_admitted(
            scores,
            &bounds[..len],
            (base, valid, skip),
            |r, index, o| {
                let candidate = (signed_key(o), index);
                if candidate < self.best[g0 + r] {
                    self.best[g0 + r] = candidate;
                    // A NaN best (its key orders it where its bits put it) leaves every score
                    // admissible, for the keys to decide.
                    self.bounds[g0 + r] = if o.is_nan() { f32::INFINITY } else { o };
                }
            },
        );
    }

    fn pairs(self) -> Vec<[u32; 2]> {
        let pair = |&(key, index): &Best| [unsigned_key(key), index];
        self.best.iter().map(pair).collect()
    }
}

/// Calls `offer(r, index, score)` for each lane of a tile whose row's bound admits it (rows
/// as many as `bounds` has, at most `R`), that counts (`j < valid`) and is not the row's
/// `skip`, by row then index. The common tile, which admits nothing, costs one test
/// ([`any_admitted`]); the others visit only their admitted lanes ([`admitted_rows`]).
#[inline(always)]
fn visit_admitted<const R: usize, const W: usize>(
    scores: &[[f32; W]; R],
    bounds: &[f32],
    (base, valid, skip): (u32, u32, &[u32; R]),
    mut offer: impl FnMut(usize, u32, f32),
) {
    if !any_admitted(scores, bounds) {
        return;
    }
    let (lanes, mut rows) = admitted_rows(scores, bounds);
    while rows != 0 {
        let r = rows.trailing_zeros() as usize;
        rows &= rows - 1;
        let mut hits = lanes[r];
        while hits != 0 {
            let j = hits.trailing_zeros();
            hits &= hits - 1;
            let index = base.wrapping_add(j);
            if j < valid && index != skip[r] {
                offer(r, index, scores[r][j as usize]);
            }
        }
    }
}

/// The lanes of each of a tile's rows that its bound admits (bit `j` of word `r`; rows as
/// many as `bounds` has, at most `R`), and the rows with any (bit `r`), computed with no
/// branch: a visit of the set bits alone then costs no mispredicted branch per row, where
/// many tiles admit something (early in a search, or at large `k`).
#[inline(always)]
fn admitted_rows<const R: usize, const W: usize>(
    scores: &[[f32; W]; R],
    bounds: &[f32],
) -> ([u64; R], u32) {
    const {
        assert!(
            W <= 64 && R <= 32,
            "a row's lanes are a u64, the rows a u32"
        )
    };
    let mut lanes = [0u64; R];
    let mut rows = 0u32;
    for (r, (scores, &bound)) in scores.iter().zip(bounds).enumerate() {
        lanes[r] = admitted_lanes(scores, bound);
        rows |= u32::from(lanes[r] != 0) << r;
    }
    (lanes, rows)
}

/// Whether any score of a tile's rows (as many as `bounds` has, at most `R`) is admitted by
/// its row's bound ([`admits`]): a compare and an or per vector of lanes and a single test,
/// so that the common tile, which admits nothing, costs no branch per row.
#[inline(always)]
fn any_admitted<const R: usize, const W: usize>(scores: &[[f32; W]; R], bounds: &[f32]) -> bool {
    let mut lanes = [0u32; W];
    for (scores, &bound) in scores.iter().zip(bounds) {
        for j in 0..W {
            lanes[j] |= u32::from(admits(scores[j], bound));
        }
    }
    lanes.iter().fold(0, |any, &lane| any | lane) != 0
}

/// `k > 1`: the general path's candidate list per row, fed from the tiles that reach a
/// row's bound ([`any_admitted`]).
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
        let (k, g0) = (self.k, self.group.start);
        let lists = &self.lists[self.group.clone()];
        // Rows past the group's (a last group of fewer) are not compared. A plain loop:
        // `array::from_fn` here stayed a call per tile (AVX-512).
        let mut bounds = [0.0; R];
        for (bound, list) in bounds.iter_mut().zip(lists) {
            *bound = list.bound;
        }
        let rows = lists.len();
        visit_admitted(
            scores,
            &bounds[..rows],
            (base, valid, skip),
            |r, index, o| {
                // `offer` tests the bound again, as a shrink may have tightened it.
                let list = &mut self.lists[g0 + r];
                if list.admits(o) {
                    list.offer(o, index, k);
                }
            },
        );
    }

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
    let groups = rows.len().div_ceil(R);
    // A last group of fewer rows repeats its last row; `select` drops those.
    let row = |g: usize, r: usize| rows.start + (g * R + r).min(rows.len() - 1);
    let grouped = &mut scratch.grouped[..groups * R * d];
    for (g, group) in grouped.chunks_exact_mut(R * d).enumerate() {
        let (columns, _) = group.as_chunks_mut::<R>();
        for r in 0..R {
            // Each row divided by its norm as it is read ([`Norms::dividing`]; nothing to
            // divide by without divisors), as the general path reads it.
            let div = q_norms.div.get(row(g, r)).copied();
            for (column, &x) in columns.iter_mut().zip(queries.row(row(g, r))) {
                column[r] = div.map_or(x, |by| x / by);
            }
        }
    }
    let grouped = &scratch.grouped[..groups * R * d];
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
        for (g, group) in grouped.chunks_exact(R * d).enumerate() {
            let (g0, len) = (g * R, R.min(rows.len() - g * R));
            let (columns, _) = group.as_chunks::<R>();
            let qs: [f32; R] = std::array::from_fn(|r| q_norms.scale[row(g, r)]);
            let qq: [f32; R] = std::array::from_fn(|r| q_norms.sq[row(g, r)]);
            let skip: [u32; R] = std::array::from_fn(|r| block.excluded[row(g, r)]);
            select.start(g0, len);
            let panels = packed.chunks_exact(d * W).zip(ref_scale).zip(ref_sq);
            for (p, ((panel, rs), rq)) in panels.enumerate() {
                let mut scores = dot_tile::<R, W, FMA>(panel, columns);
                // Plain loops over copies: `array::from_fn` here compiled to a call per row
                // and, with the factors read through references, to scalar code.
                let (rs, rq) = (*rs, *rq);
                for r in 0..R {
                    for j in 0..W {
                        scores[r][j] = oriented(scores[r][j], qs[r], qq[r], rs[j], rq[j]);
                    }
                }
                let valid = (cols - p * W).min(W) as u32;
                select.tile(&scores, (c0 + p * W) as u32, valid, &skip);
            }
        }
        block.report.add((rows.len() * cols) as u64);
    }
    select.pairs()
}

/// The general path's GEMM sums the dimension in slices of this many, each a chain of its
/// own, then adds each slice's sums to the total: doing the same keeps the two paths' dot
/// products, and so their answers, bit for bit equal.
const GEMM_SLICE: usize = crate::runtime::gemm::KC;

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
            for (lanes, &v) in panel.iter_mut().zip(refs.row(start + j)) {
                if let Some(lane) = lanes.get_mut(j) {
                    *lane = v;
                }
            }
        }
        // Then each component of the panel's references divided by their divisors at once,
        // a vector division per `W` lanes (the same quotients as one at a time); padding
        // lanes divide zero by one.
        if let Some(div) = div.get(p * W..p * W + cols) {
            let mut by = [1.0; W];
            by[..cols].copy_from_slice(div);
            for lanes in panel.iter_mut() {
                for j in 0..W {
                    lanes[j] /= by[j];
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
        let mut scratch = Scratch::new(d, n, q);
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
            let bytes = |s: Scratch| {
                4 * (s.packed.len() + s.ref_scale.len() + s.ref_sq.len() + s.grouped.len())
            };
            assert_eq!(
                scratch_bytes(0, (n, d), 1),
                bytes(Scratch::new(d, n, 0)) as u64
            );
            let buffers = bytes(Scratch::new(d, n, 10));
            // A row's best (8 bytes) and bound (4), and its answer (8).
            assert_eq!(scratch_bytes(10, (n, d), 1), buffers as u64 + 10 * 20);
            let list = 8 * Candidates::capacity(7) + std::mem::size_of::<Candidates>();
            assert_eq!(
                scratch_bytes(10, (n, d), 7),
                (buffers + 10 * (list + 8 * 7)) as u64
            );
        }
    }
}

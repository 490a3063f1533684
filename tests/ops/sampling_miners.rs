//! PML's angular, HDC, distance-weighted and uniform-histogram miners on the native path and
//! the GPU path: the deterministic two against brute-force emulations of PML's code (the
//! angle in double precision with a band for rounding; HDC's top-k over the distance matrix
//! the same path computes), the random two by their structure and, over many seeds, by
//! chi-square tests of their draws against the probabilities PML's code gives.

use crate::common;

use std::sync::{Arc, Mutex};

use ndarray::{s, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::{
    angular_triplets, distance_weighted_triplets, hdc_pairs, mine_plan, pairwise_distances,
    uniform_histogram_pairs, AngularConfig, Context, Distance, DistanceConfig,
    DistanceWeightedConfig, Error, HdcConfig, Hooks, MiningSet, PairwiseConfig, SelfExclusion,
    UniformHistogramConfig,
};

/// The native context and, when there is one, the shared GPU context.
fn contexts(native: &Context) -> Vec<&Context> {
    let mut all = vec![native];
    all.extend(common::shared_gpu());
    all
}

/// Queries, optional references, and which reference is each query itself.
#[derive(Debug, Clone)]
struct Case {
    labels: Array1<u32>,
    emb: Array2<f32>,
    refs: Option<(Array2<f32>, Array1<u32>)>,
    /// With references: they start with the queries (`SelfExclusion::SameIndex`).
    same_index: bool,
}

impl Case {
    fn queries(&self) -> MiningSet<'_, u32> {
        MiningSet::new(self.emb.view(), self.labels.view())
    }

    fn ref_set(&self) -> Option<MiningSet<'_, u32>> {
        self.refs
            .as_ref()
            .map(|(x, y)| MiningSet::new(x.view(), y.view()))
    }

    fn exclusion(&self) -> SelfExclusion {
        if self.same_index {
            SelfExclusion::SameIndex
        } else {
            SelfExclusion::Auto
        }
    }

    fn ref_emb(&self) -> &Array2<f32> {
        self.refs.as_ref().map_or(&self.emb, |(x, _)| x)
    }

    fn ref_labels(&self) -> &Array1<u32> {
        self.refs.as_ref().map_or(&self.labels, |(_, y)| y)
    }

    /// Whether reference `r` is query `a` itself.
    fn is_self(&self, a: usize, r: usize) -> bool {
        (self.refs.is_none() || self.same_index) && a == r
    }

    fn positive(&self, a: usize, r: usize) -> bool {
        self.labels[a] == self.ref_labels()[r] && !self.is_self(a, r)
    }

    fn negative(&self, a: usize, r: usize) -> bool {
        self.labels[a] != self.ref_labels()[r]
    }

    /// The distances the path computes.
    fn matrix(&self, ctx: &Context, distance: DistanceConfig) -> Array2<f32> {
        pairwise_distances(
            ctx,
            self.emb.view(),
            self.ref_emb().view(),
            &PairwiseConfig {
                distance,
                ..Default::default()
            },
        )
        .expect("distances")
        .values
    }
}

/// Rows on a coarse grid (ties and duplicates are common), 1–4 classes, with or without
/// references (unrelated, or starting with the queries).
fn case() -> impl Strategy<Value = Case> {
    (0usize..20, 1usize..6, 1u32..5, 0usize..3, 0usize..12).prop_flat_map(
        |(b, d, classes, mode, extra)| {
            let m = match mode {
                0 => b,
                1 => extra,
                _ => b + extra,
            };
            (
                proptest::collection::vec(0..classes, b),
                proptest::collection::vec(-4i32..5, b * d),
                proptest::collection::vec(0..classes, m),
                proptest::collection::vec(-4i32..5, m * d),
            )
                .prop_map(move |(y, x, ry, rx)| {
                    let grid = |v: Vec<i32>, n: usize| {
                        Array2::from_shape_vec((n, d), v.iter().map(|&i| i as f32 * 0.5).collect())
                            .expect("shape")
                    };
                    let emb = grid(x, b);
                    let labels = Array1::from(y);
                    let refs = match mode {
                        0 => None,
                        1 => Some((grid(rx, m), Array1::from(ry))),
                        _ => {
                            let mut rx = grid(rx, m);
                            let mut ry = Array1::from(ry);
                            rx.slice_mut(s![..b, ..]).assign(&emb);
                            ry.slice_mut(s![..b]).assign(&labels);
                            Some((rx, ry))
                        }
                    };
                    Case {
                        labels,
                        emb,
                        refs,
                        same_index: mode == 2,
                    }
                })
        },
    )
}

fn pairs_of(rows: &Array2<u32>) -> Vec<[u32; 2]> {
    rows.rows().into_iter().map(|r| [r[0], r[1]]).collect()
}

/// PML `HDCMiner.mine` over the path's matrix: each side's pairs row-major, then a stable
/// sort by value (hardest first) and the first `⌈f · count⌉`.
fn hdc_emulated(c: &Case, values: &Array2<f32>, f: f64, similarity: bool) -> [Vec<[u32; 2]>; 2] {
    let side = |keep: &dyn Fn(usize, usize) -> bool, largest: bool| {
        let mut pairs: Vec<(f32, [u32; 2])> = Vec::new();
        for a in 0..values.nrows() {
            for r in (0..values.ncols()).filter(|&r| keep(a, r)) {
                pairs.push((values[[a, r]], [a as u32, r as u32]));
            }
        }
        let k = (f * pairs.len() as f64).ceil() as usize;
        pairs.sort_by(|x, y| {
            let o = x.0.partial_cmp(&y.0).expect("finite");
            if largest {
                o.reverse()
            } else {
                o
            }
        });
        pairs.truncate(k);
        pairs.into_iter().map(|(_, p)| p).collect()
    };
    [
        side(&|a, r| c.positive(a, r), !similarity),
        side(&|a, r| c.negative(a, r), similarity),
    ]
}

fn check_hdc(ctx: &Context, c: &Case, distance: DistanceConfig, f: f64) {
    let cfg = HdcConfig {
        filter_percentage: f,
        distance,
        self_exclusion: c.exclusion(),
        ..Default::default()
    };
    let got = hdc_pairs(ctx, &c.queries(), c.ref_set().as_ref(), &cfg).expect("hdc");
    let want = hdc_emulated(
        c,
        &c.matrix(ctx, distance),
        f,
        distance.distance.is_similarity(),
    );
    assert_eq!(
        pairs_of(&got.positives),
        want[0],
        "positives on {}",
        ctx.device_name()
    );
    assert_eq!(
        pairs_of(&got.negatives),
        want[1],
        "negatives on {}",
        ctx.device_name()
    );
}

/// PML `AngularMiner.mine` in double precision: `None` for a triplet whose angle is within
/// rounding of the threshold (the path's `f32` and its distance expansion may go either way).
fn angle_kept(c: &Case, a: usize, p: usize, n: usize, threshold: f64) -> Option<bool> {
    let (x, r) = (c.emb.row(a), c.ref_emb());
    let (y, z) = (r.row(p), r.row(n));
    let mut ap2 = 0.0f64;
    let (mut nc2, mut scale) = (0.0f64, 1e-12f64);
    for j in 0..x.len() {
        let (xa, yp, zn) = (f64::from(x[j]), f64::from(y[j]), f64::from(z[j]));
        ap2 += (xa - yp + 1e-6).powi(2);
        let centre = (xa + yp) / 2.0;
        nc2 += (zn - centre + 1e-6).powi(2);
        scale += zn * zn + centre * centre;
    }
    let ap = ap2.sqrt();
    // The tile's |n|² + |c|² − 2 n·c in f32 is off by a few ulps of the larger terms.
    let slack = 1e-5 * scale;
    let lo = (ap * (1.0 - 1e-5) / (2.0 * (nc2 + slack).sqrt())).atan();
    let hi = (ap * (1.0 + 1e-5) / (2.0 * (nc2 - slack).max(0.0).sqrt())).atan();
    if lo > threshold + 1e-6 {
        Some(true)
    } else if hi < threshold - 1e-6 {
        Some(false)
    } else {
        None
    }
}

fn check_angular(ctx: &Context, c: &Case, angle: f64) {
    let cfg = AngularConfig {
        angle,
        self_exclusion: c.exclusion(),
        ..Default::default()
    };
    let got = angular_triplets(ctx, &c.queries(), c.ref_set().as_ref(), &cfg).expect("angular");
    compare_angular(ctx, c, &got.indices, angle);
}

/// Mined triplets against the emulation: every clearly kept triplet present, no clearly
/// rejected one, in PML's order.
fn compare_angular(ctx: &Context, c: &Case, mined: &Array2<u32>, angle: f64) {
    let rows: Vec<[u32; 3]> = mined
        .rows()
        .into_iter()
        .map(|t| [t[0], t[1], t[2]])
        .collect();
    assert!(
        rows.windows(2).all(|w| w[0] < w[1]),
        "PML's (a, p, n) order"
    );
    let threshold = angle.to_radians();
    let m = c.ref_labels().len();
    let mut want = Vec::new();
    for a in 0..c.labels.len() {
        for p in (0..m).filter(|&p| c.positive(a, p)) {
            for n in (0..m).filter(|&n| c.negative(a, n)) {
                match angle_kept(c, a, p, n, threshold) {
                    Some(true) => want.push([a as u32, p as u32, n as u32]),
                    Some(false) => {
                        assert!(
                            rows.binary_search(&[a as u32, p as u32, n as u32]).is_err(),
                            "({a}, {p}, {n}) kept"
                        )
                    }
                    None => {}
                }
            }
        }
    }
    for t in &want {
        assert!(
            rows.binary_search(t).is_ok(),
            "{t:?} missing on {}",
            ctx.device_name()
        );
    }
    for t in &rows {
        let [a, p, n] = t.map(|i| i as usize);
        assert!(
            c.positive(a, p) && c.negative(a, n),
            "{t:?} is not a valid triplet"
        );
    }
}

const LP_DISTANCES: [DistanceConfig; 4] = [
    DistanceConfig {
        distance: Distance::Euclidean,
        normalize: true,
    },
    DistanceConfig {
        distance: Distance::Euclidean,
        normalize: false,
    },
    DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: true,
    },
    DistanceConfig {
        distance: Distance::Cosine,
        normalize: true,
    },
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(32)))]

    #[test]
    fn hdc_and_angular_match_pml_emulation(c in case(), f in prop_oneof![Just(0.0), Just(1.0), 0.0f64..1.0], dist in 0usize..4, angle in prop_oneof![Just(20.0f64), 0.0f64..90.0]) {
        let native = Context::native_cpu(None);
        for ctx in contexts(&native) {
            check_hdc(ctx, &c, LP_DISTANCES[dist], f);
            check_angular(ctx, &c, angle);
        }
    }
}

#[test]
fn hdc_matches_pml_test_vectors_on_every_path() {
    // tests/miners/test_hdc_miner.py: filter 0.3, labels [0,0,1,1,1,0], 1-D 0..5 (raw L2) or
    // the unit vectors at 0°, 20°, …, 100° (normalised L2, its square, cosine): the expected
    // pairs in top-k order, compared as PML's helper compares them: by |a − b| (which pair
    // of a tie comes first is torch.topk's choice).
    let labels = Array1::from(vec![0u32, 0, 1, 1, 1, 0]);
    let line = Array2::from_shape_fn((6, 1), |(i, _)| i as f32);
    let circle = Array2::from_shape_fn((6, 2), |(i, j)| {
        let t = (20.0 * i as f32).to_radians();
        if j == 0 {
            t.cos()
        } else {
            t.sin()
        }
    });
    let want_pos = vec![[0, 5], [5, 0], [1, 5], [5, 1]];
    let want_neg = vec![[1, 2], [2, 1], [4, 5], [5, 4], [0, 2], [2, 0]];
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        for (x, distance) in [
            (&line, LP_DISTANCES[1]),
            (&circle, LP_DISTANCES[0]),
            (&circle, LP_DISTANCES[2]),
            (&circle, LP_DISTANCES[3]),
        ] {
            let cfg = HdcConfig {
                filter_percentage: 0.3,
                distance,
                ..Default::default()
            };
            let p = hdc_pairs(ctx, &MiningSet::new(x, &labels), None, &cfg).expect("hdc");
            let gaps =
                |rows: &[[u32; 2]]| rows.iter().map(|r| r[0].abs_diff(r[1])).collect::<Vec<_>>();
            let on = ctx.device_name();
            assert_eq!(
                gaps(&pairs_of(&p.positives)),
                gaps(&want_pos),
                "{distance:?} on {on}"
            );
            assert_eq!(
                gaps(&pairs_of(&p.negatives)),
                gaps(&want_neg),
                "{distance:?} on {on}"
            );
        }
    }
}

/// 2 100 × 2 100 rows: 4.4 M pairs, beyond what the all-pair miners keep on the host, so
/// HDC's cut comes from a histogram pass and the histogram's picks from a third pass.
fn big_case() -> Case {
    let n = 2100;
    let emb = Array2::from_shape_fn((n, 4), |(i, j)| ((i * 7 + j * 13) % 29) as f32 * 0.25 - 3.0);
    let labels = Array1::from_shape_fn(n, |i| (i % 5) as u32);
    Case {
        labels,
        emb,
        refs: None,
        same_index: false,
    }
}

#[test]
fn hdc_beyond_the_kept_pairs_matches_pml_emulation() {
    let c = big_case();
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        check_hdc(ctx, &c, LP_DISTANCES[1], 0.37);
    }
    // Keeping nothing skips the second pass; progress still reaches its total (2 · b · m).
    let last = Arc::new(Mutex::new((0, 0)));
    let seen = Arc::clone(&last);
    let hooks = Hooks::new().on_progress(move |p| *seen.lock().expect("log") = (p.done, p.total));
    let cfg = HdcConfig {
        filter_percentage: 0.0,
        hooks,
        ..Default::default()
    };
    let p = hdc_pairs(&native, &c.queries(), None, &cfg).expect("hdc");
    assert_eq!((p.positives.nrows(), p.negatives.nrows()), (0, 0));
    let pairs = 2 * 2100 * 2100;
    assert_eq!(*last.lock().expect("log"), (pairs, pairs));
}

#[test]
fn angular_centres_span_several_blocks() {
    // 131 072 references allow 128 centres per block; two anchors with 299 positives each
    // (598 centres) need five blocks. The other references are far away (narrow angles,
    // nothing kept) but for one close negative among the positives.
    let m = 1 << 17;
    let refs = Array2::from_shape_fn((m, 2), |(i, j)| {
        if i < 300 {
            (i as f32 * 0.01) * if j == 0 { 1.0 } else { -1.0 }
        } else {
            1000.0 + i as f32 + j as f32
        }
    });
    let ref_labels = Array1::from_shape_fn(m, |i| u32::from(i >= 300) + u32::from(i >= 301));
    let mut ref_labels = ref_labels;
    ref_labels[150] = 1; // one close negative among the positives
    let emb = ndarray::array![[0.5f32, 0.5], [-0.5, 0.25]];
    let c = Case {
        labels: Array1::from(vec![0u32, 0]),
        emb,
        refs: Some((refs, ref_labels)),
        same_index: false,
    };
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        let cfg = AngularConfig::default();
        let got = angular_triplets(ctx, &c.queries(), c.ref_set().as_ref(), &cfg).expect("angular");
        // The close negative is seen at a wide angle from some centres.
        assert!(got.indices.nrows() > 0);
        assert!(got.indices.column(2).iter().all(|&n| n == 150));
        compare_angular(ctx, &c, &got.indices, cfg.angle);
    }
}

/// PML `DistanceWeightedMiner`'s weights over the path's matrix, as PML computes them in
/// `f32`: per anchor, its negatives' probabilities (empty when PML draws nothing for it).
fn distance_weighted_emulated(
    c: &Case,
    values: &Array2<f32>,
    cutoff: f32,
    nonzero: f32,
) -> Vec<Vec<(u32, f64)>> {
    let d = c.emb.ncols() as f64;
    let (two_minus_d, half) = ((2.0 - d) as f32, ((d - 3.0) / 2.0) as f32);
    let mat = values.mapv(|v| if v < cutoff { cutoff } else { v });
    let log_w = mat.mapv(|x| two_minus_d * x.ln() - half * (1.0 - 0.25 * (x * x)).ln());
    let (b, m) = mat.dim();
    let same = Array2::from_shape_fn((b, m), |(a, r)| c.labels[a] == c.ref_labels()[r]);
    let masked = Array2::from_shape_fn((b, m), |(a, r)| {
        if same[[a, r]] {
            log_w[[a, r]] * 0.0
        } else {
            log_w[[a, r]]
        }
    });
    let max = masked
        .indexed_iter()
        .filter(|&((a, r), _)| log_w[[a, r]].is_finite())
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    (0..b)
        .map(|a| {
            let has_positive = (0..m).any(|r| c.positive(a, r));
            let w: Vec<(u32, f32)> = (0..m)
                .filter(|&r| c.negative(a, r))
                .map(|r| {
                    let ok = log_w[[a, r]].is_finite() && mat[[a, r]] < nonzero;
                    (
                        r as u32,
                        if ok {
                            (masked[[a, r]] - max).exp()
                        } else {
                            0.0
                        },
                    )
                })
                .collect();
            let sum: f32 = w.iter().map(|x| x.1).sum();
            if !has_positive || sum.is_nan() || sum <= 0.0 {
                return Vec::new();
            }
            w.into_iter()
                .map(|(r, x)| (r, f64::from(x / sum)))
                .collect()
        })
        .collect()
}

/// The structure of distance-weighted triplets: anchors ascending, each PML's number of
/// times (its label's references), a positive and a negative of weight > 0 each; exactly the
/// anchors PML draws for.
fn check_distance_weighted(ctx: &Context, c: &Case, cfg: &DistanceWeightedConfig) -> Array2<u32> {
    let got = distance_weighted_triplets(ctx, &c.queries(), c.ref_set().as_ref(), cfg)
        .expect("distance weighted");
    let probs = distance_weighted_emulated(
        c,
        &c.matrix(ctx, DistanceConfig::default()),
        cfg.cutoff,
        cfg.nonzero_loss_cutoff,
    );
    let mut at = 0;
    for (a, p) in probs.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        let count = c.ref_labels().iter().filter(|&&l| l == c.labels[a]).count();
        for t in got.indices.slice(s![at..at + count, ..]).rows() {
            assert_eq!(t[0] as usize, a, "anchor order on {}", ctx.device_name());
            assert!(c.positive(a, t[1] as usize), "{t:?}: not a positive");
            let w = p.iter().find(|x| x.0 == t[2]).map_or(0.0, |x| x.1);
            assert!(w > 0.0, "{t:?}: a negative of weight 0");
        }
        at += count;
    }
    assert_eq!(
        at,
        got.indices.nrows(),
        "anchors PML leaves out were drawn for"
    );
    got.indices
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(32)))]

    #[test]
    fn distance_weighted_draws_what_pml_can_draw(c in case(), seed in any::<u64>(), cutoff in prop_oneof![Just(0.5f32), 0.0f32..2.5], nonzero in prop_oneof![Just(1.4f32), 0.0f32..2.5]) {
        let native = Context::native_cpu(None);
        let cfg = DistanceWeightedConfig { cutoff, nonzero_loss_cutoff: nonzero, seed, self_exclusion: c.exclusion(), ..Default::default() };
        for ctx in contexts(&native) {
            let first = check_distance_weighted(ctx, &c, &cfg);
            let again = distance_weighted_triplets(ctx, &c.queries(), c.ref_set().as_ref(), &cfg).expect("again");
            prop_assert_eq!(first, again.indices, "a function of the inputs and the seed");
        }
    }

    #[test]
    fn uniform_histogram_draws_from_pml_bins(c in case(), seed in any::<u64>(), bins in 1usize..12, per in (1usize..4, 1usize..4), dist in 0usize..4) {
        let native = Context::native_cpu(None);
        let cfg = UniformHistogramConfig { num_bins: bins, pos_per_bin: per.0, neg_per_bin: per.1, distance: LP_DISTANCES[dist], seed, self_exclusion: c.exclusion(), ..Default::default() };
        for ctx in contexts(&native) {
            check_uniform_histogram(ctx, &c, &cfg);
        }
    }
}

/// `torch.linspace` in `f32` (PyTorch's CPU kernel: the first half from the start, the
/// second back from the end).
fn linspace(lo: f32, hi: f32, steps: usize) -> Vec<f32> {
    let step = (hi - lo) / (steps - 1) as f32;
    (0..steps)
        .map(|i| {
            if i < steps / 2 {
                lo + step * i as f32
            } else {
                hi - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}

/// PML `UniformHistogramMiner.filter_by_bin`'s members: per side, per bin (PML's loop
/// conditions), the pairs `(a, r)` in row-major order.
fn histogram_emulated(c: &Case, values: &Array2<f32>, bins: usize) -> [Vec<Vec<[u32; 2]>>; 2] {
    let side = |keep: &dyn Fn(usize, usize) -> bool| {
        let mut pairs = Vec::new();
        for a in 0..values.nrows() {
            for r in (0..values.ncols()).filter(|&r| keep(a, r)) {
                pairs.push((values[[a, r]], [a as u32, r as u32]));
            }
        }
        if pairs.is_empty() {
            return vec![Vec::new(); bins];
        }
        let lo = pairs.iter().map(|p| p.0).fold(f32::INFINITY, f32::min);
        let hi = pairs.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
        let edges = linspace(lo, hi, bins + 1);
        (0..bins)
            .map(|i| {
                let (s, e) = (edges[i], edges[i + 1]);
                pairs
                    .iter()
                    .filter(|p| s <= p.0 && (p.0 < e || (i == bins - 1 && p.0 <= e)))
                    .map(|p| p.1)
                    .collect()
            })
            .collect()
    };
    [
        side(&|a, r| c.positive(a, r)),
        side(&|a, r| c.negative(a, r)),
    ]
}

/// One bin's draws and its members.
type DrawnBin = (Vec<[u32; 2]>, Vec<[u32; 2]>);

/// Rows bin by bin (the non-empty ones, ascending), `per_bin` each, every row a member of
/// its bin. Returns each side's rows grouped by bin with the bin's members.
fn check_uniform_histogram(
    ctx: &Context,
    c: &Case,
    cfg: &UniformHistogramConfig,
) -> [Vec<DrawnBin>; 2] {
    let got =
        uniform_histogram_pairs(ctx, &c.queries(), c.ref_set().as_ref(), cfg).expect("histogram");
    let bins = histogram_emulated(c, &c.matrix(ctx, cfg.distance), cfg.num_bins);
    let mut out: [Vec<DrawnBin>; 2] = [Vec::new(), Vec::new()];
    for (s, (rows, per)) in [
        (&got.positives, cfg.pos_per_bin),
        (&got.negatives, cfg.neg_per_bin),
    ]
    .into_iter()
    .enumerate()
    {
        let rows = pairs_of(rows);
        let members: Vec<&Vec<[u32; 2]>> = bins[s].iter().filter(|b| !b.is_empty()).collect();
        assert_eq!(
            rows.len(),
            members.len() * per,
            "side {s}: rows per non-empty bin on {}",
            ctx.device_name()
        );
        for (drawn, members) in rows.chunks(per.max(1)).zip(members) {
            for pair in drawn {
                assert!(
                    members.contains(pair),
                    "side {s}: {pair:?} drawn outside its bin"
                );
            }
            out[s].push((drawn.to_vec(), members.clone()));
        }
    }
    out
}

/// Pearson's statistic of `observed` counts against `expected` ones (expected > 0), and its
/// degrees of freedom.
fn chi_square(observed: &[f64], expected: &[f64]) -> (f64, f64) {
    let stat = observed
        .iter()
        .zip(expected)
        .map(|(o, e)| (o - e) * (o - e) / e)
        .sum();
    (stat, (observed.len() as f64 - 1.0).max(0.0))
}

/// A pooled chi-square statistic far in the upper tail (p ≈ 1e-6 for large df): the draws
/// do not follow the distribution. Deterministic: the seeds are fixed.
fn assert_fits(stat: f64, df: f64, what: &str) {
    let limit = df + 5.0 * (2.0 * df).sqrt() + 10.0;
    assert!(
        stat < limit,
        "{what}: chi-square {stat:.1} on {df} degrees of freedom (limit {limit:.1})"
    );
    eprintln!("{what}: chi-square {stat:.1} on {df} degrees of freedom");
}

/// Twelve points in four dimensions, three labels: spread enough that every negative has a
/// weight and the histograms have many non-empty bins.
fn sampling_case() -> Case {
    let emb = Array2::from_shape_fn((12, 4), |(i, j)| {
        (((i * 5 + j * 3) % 7) as f32 - 3.0) * 0.4 + if j == i % 4 { 1.5 } else { 0.0 }
    });
    Case {
        labels: Array1::from_shape_fn(12, |i| (i % 3) as u32),
        emb,
        refs: None,
        same_index: false,
    }
}

#[test]
fn distance_weighted_negatives_follow_pml_weights() {
    let c = sampling_case();
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        let probs =
            distance_weighted_emulated(&c, &c.matrix(ctx, DistanceConfig::default()), 0.5, 1.4);
        let b = c.labels.len();
        let mut neg = vec![vec![0f64; b]; b];
        let mut pos = vec![vec![0f64; b]; b];
        let seeds = 400;
        for seed in 0..seeds {
            let cfg = DistanceWeightedConfig {
                seed,
                ..Default::default()
            };
            let t = check_distance_weighted(ctx, &c, &cfg);
            for row in t.rows() {
                neg[row[0] as usize][row[2] as usize] += 1.0;
                pos[row[0] as usize][row[1] as usize] += 1.0;
            }
        }
        let (mut stat, mut df) = (0.0, 0.0);
        let (mut pstat, mut pdf) = (0.0, 0.0);
        for a in 0..b {
            assert!(!probs[a].is_empty(), "anchor {a} has weights");
            let draws: f64 = neg[a].iter().sum();
            let (o, e): (Vec<f64>, Vec<f64>) = probs[a]
                .iter()
                .filter(|x| x.1 > 0.0)
                .map(|&(n, p)| (neg[a][n as usize], p * draws))
                .unzip();
            let (s, f) = chi_square(&o, &e);
            (stat, df) = (stat + s, df + f);
            let positives: Vec<usize> = (0..b).filter(|&p| c.positive(a, p)).collect();
            let o: Vec<f64> = positives.iter().map(|&p| pos[a][p]).collect();
            let e = vec![draws / positives.len() as f64; positives.len()];
            let (s, f) = chi_square(&o, &e);
            (pstat, pdf) = (pstat + s, pdf + f);
        }
        assert_fits(stat, df, &format!("negatives on {}", ctx.device_name()));
        assert_fits(pstat, pdf, &format!("positives on {}", ctx.device_name()));
    }
}

#[test]
fn distance_weighted_weights_underflow_against_the_global_max_as_in_pml() {
    // d = 256: a negative at the cutoff (δ = 0.5) has log w ≈ 176, so exp(log w − max)
    // underflows in f32 for an anchor whose negatives all lie near δ ≈ 1.35. PML then draws
    // nothing for that anchor; a per-row max would draw for it.
    let d = 256;
    let unit = |j: usize| Array1::from_shape_fn(d, |k| f32::from(k == j));
    let mut emb = Array2::<f32>::zeros((5, d));
    emb.row_mut(0).assign(&unit(0));
    emb.row_mut(1).assign(&(&unit(0) * 0.95 + &unit(1) * 0.31));
    emb.row_mut(2).assign(&(&unit(0) * 0.9 + &unit(2) * 0.44)); // a close negative of 0 and 1
    emb.row_mut(3)
        .assign(&(&unit(3) * 0.7 + &unit(4) * 0.7 + &unit(0) * 0.1)); // only far negatives
    emb.row_mut(4)
        .assign(&(&unit(3) * 0.7 + &unit(4) * 0.69 + &unit(0) * 0.12));
    let c = Case {
        labels: Array1::from(vec![0u32, 0, 1, 2, 2]),
        emb,
        refs: None,
        same_index: false,
    };
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        let probs =
            distance_weighted_emulated(&c, &c.matrix(ctx, DistanceConfig::default()), 0.5, 1.4);
        assert!(
            !probs[0].is_empty() && probs[3].is_empty(),
            "the case shows the underflow: {probs:?}"
        );
        let t = check_distance_weighted(ctx, &c, &DistanceWeightedConfig::default());
        assert!(t.column(0).iter().all(|&a| a < 2), "{t:?}");
    }
}

#[test]
fn uniform_histogram_draws_uniformly_within_bins() {
    let c = sampling_case();
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        let mut counts: [Vec<std::collections::HashMap<[u32; 2], f64>>; 2] =
            [Vec::new(), Vec::new()];
        let mut members: [Vec<Vec<[u32; 2]>>; 2] = [Vec::new(), Vec::new()];
        for seed in 0..300 {
            let cfg = UniformHistogramConfig {
                num_bins: 8,
                pos_per_bin: 4,
                neg_per_bin: 4,
                seed,
                ..Default::default()
            };
            let sides = check_uniform_histogram(ctx, &c, &cfg);
            for (s, bins) in sides.into_iter().enumerate() {
                if counts[s].is_empty() {
                    counts[s] = vec![Default::default(); bins.len()];
                    members[s] = bins.iter().map(|b| b.1.clone()).collect();
                }
                for (i, (drawn, _)) in bins.into_iter().enumerate() {
                    for p in drawn {
                        *counts[s][i].entry(p).or_default() += 1.0;
                    }
                }
            }
        }
        let (mut stat, mut df) = (0.0, 0.0);
        for s in 0..2 {
            for (bin, members) in counts[s].iter().zip(&members[s]) {
                let draws: f64 = bin.values().sum();
                let o: Vec<f64> = members
                    .iter()
                    .map(|p| bin.get(p).copied().unwrap_or(0.0))
                    .collect();
                let e = vec![draws / members.len() as f64; members.len()];
                let (x, f) = chi_square(&o, &e);
                (stat, df) = (stat + x, df + f);
            }
        }
        assert!(df > 20.0, "the case has bins with several members");
        assert_fits(
            stat,
            df,
            &format!("histogram picks on {}", ctx.device_name()),
        );
    }
}

#[test]
fn uniform_histogram_beyond_the_kept_pairs_draws_from_pml_bins() {
    let c = big_case();
    let native = Context::native_cpu(None);
    for ctx in contexts(&native) {
        let cfg = UniformHistogramConfig {
            distance: LP_DISTANCES[1],
            seed: 3,
            ..Default::default()
        };
        let sides = check_uniform_histogram(ctx, &c, &cfg);
        assert!(sides.iter().all(|s| s.len() > 10), "many non-empty bins");
    }
}

#[test]
fn random_miners_answer_alike_under_any_budget_and_differ_by_seed() {
    let c = sampling_case();
    let Some(small) = common::gpu_context(Some(64 << 10)) else {
        return;
    };
    let Some(big) = common::shared_gpu() else {
        return;
    };
    let native = Context::native_cpu(None);
    let (seed, other) = (1u64, 2u64);
    {
        let dw = |ctx: &Context, seed| {
            distance_weighted_triplets(
                ctx,
                &c.queries(),
                None,
                &DistanceWeightedConfig {
                    seed,
                    ..Default::default()
                },
            )
            .expect("dw")
            .indices
        };
        let uh = |ctx: &Context, seed| {
            let p = uniform_histogram_pairs(
                ctx,
                &c.queries(),
                None,
                &UniformHistogramConfig {
                    seed,
                    ..Default::default()
                },
            )
            .expect("uh");
            (p.positives, p.negatives)
        };
        assert_eq!(dw(&small, seed), dw(big, seed));
        assert_eq!(uh(&small, seed), uh(big, seed));
        assert_ne!(dw(big, seed), dw(big, other));
        assert_ne!(uh(&native, seed), uh(&native, other));
    }
}

#[test]
fn the_new_miners_report_progress_to_their_total_and_plan_their_blocks() {
    let c = sampling_case();
    let native = Context::native_cpu(None);
    let log = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&log);
    let hooks =
        Hooks::new().on_progress(move |p| seen.lock().expect("log").push((p.done, p.total)));
    let check = |what: &str| {
        let mut l = log.lock().expect("log");
        assert!(!l.is_empty(), "{what}: no progress");
        assert!(
            l.windows(2).all(|w| w[0].0 < w[1].0),
            "{what}: progress rises"
        );
        let (done, total) = l[l.len() - 1];
        assert_eq!(done, total, "{what}: ends at its total");
        l.clear();
    };
    let set = c.queries();
    angular_triplets(
        &native,
        &set,
        None,
        &AngularConfig {
            hooks: hooks.clone(),
            ..Default::default()
        },
    )
    .expect("angular");
    check("angular");
    hdc_pairs(
        &native,
        &set,
        None,
        &HdcConfig {
            hooks: hooks.clone(),
            ..Default::default()
        },
    )
    .expect("hdc");
    check("hdc");
    distance_weighted_triplets(
        &native,
        &set,
        None,
        &DistanceWeightedConfig {
            hooks: hooks.clone(),
            ..Default::default()
        },
    )
    .expect("dw");
    check("distance weighted");
    uniform_histogram_pairs(
        &native,
        &set,
        None,
        &UniformHistogramConfig {
            hooks,
            ..Default::default()
        },
    )
    .expect("uh");
    check("uniform histogram");
    let plan = mine_plan(&native, &set, None, &HdcConfig::default()).expect("plan");
    assert_eq!((plan.rows, plan.cols, plan.chunks), (12, 12, 1));
}

#[test]
fn the_new_miners_reject_bad_parameters() {
    let native = Context::native_cpu(None);
    let (x, y) = (Array2::<f32>::zeros((2, 2)), Array1::from(vec![0u32, 1]));
    let set = MiningSet::new(&x, &y);
    let bad = |r: Result<(), Error>, what: &str| match r {
        Err(Error::InvalidParameter { what: w, .. }) => assert_eq!(w, what),
        other => panic!("{what}: {other:?}"),
    };
    for f in [-0.1, 1.5, f64::NAN] {
        bad(
            hdc_pairs(
                &native,
                &set,
                None,
                &HdcConfig {
                    filter_percentage: f,
                    ..Default::default()
                },
            )
            .map(drop),
            "filter_percentage",
        );
    }
    bad(
        angular_triplets(
            &native,
            &set,
            None,
            &AngularConfig {
                angle: f64::NAN,
                ..Default::default()
            },
        )
        .map(drop),
        "angle",
    );
    bad(
        distance_weighted_triplets(
            &native,
            &set,
            None,
            &DistanceWeightedConfig {
                cutoff: f32::INFINITY,
                ..Default::default()
            },
        )
        .map(drop),
        "cutoff",
    );
    bad(
        distance_weighted_triplets(
            &native,
            &set,
            None,
            &DistanceWeightedConfig {
                nonzero_loss_cutoff: f32::NAN,
                ..Default::default()
            },
        )
        .map(drop),
        "nonzero_loss_cutoff",
    );
    for (cfg, what) in [
        (
            UniformHistogramConfig {
                num_bins: 0,
                ..Default::default()
            },
            "num_bins",
        ),
        (
            UniformHistogramConfig {
                pos_per_bin: 0,
                ..Default::default()
            },
            "pos_per_bin",
        ),
        (
            UniformHistogramConfig {
                neg_per_bin: 0,
                ..Default::default()
            },
            "neg_per_bin",
        ),
    ] {
        bad(
            uniform_histogram_pairs(&native, &set, None, &cfg).map(drop),
            what,
        );
    }
    // A cutoff beyond the sphere leaves no finite weight: PML fails, this draws nothing.
    let t = distance_weighted_triplets(
        &native,
        &set,
        None,
        &DistanceWeightedConfig {
            cutoff: 2.5,
            ..Default::default()
        },
    )
    .expect("dw");
    assert_eq!(t.indices.nrows(), 0);
}

//! `triplet_margin_loss` against the reference that materialises every triplet
//! (`reference::triplet_margin_loss`), against finite differences of a loss written out here
//! in f64, and on the edges: margins exactly at the hinge, all-easy batches, no triplets,
//! budgets that force many blocks, a memory bank's rows, cancellation.

use crate::common;
use crate::common::{assert_close, DISTANCES};
use crate::kernels::triplet_weights::{self, Problem};

use ndarray::{array, Array1, Array2};
use proptest::prelude::*;
use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
use wgpu_metric_learning::reference::triplet_margin_loss::triplet_margin_loss as reference;
use wgpu_metric_learning::{
    pairwise_distances, triplet_margin_loss, BankConfig, CancelToken, ComputePath, Context,
    ContextConfig, Distance, DistanceConfig, Error, Hooks, MemoryBank, MiningSet, PairwiseConfig,
    SelfExclusion, TripletLossConfig, TripletRule, TripletType,
};

impl Problem {
    fn ref_side(&self) -> (Array1<u32>, Array2<f32>) {
        self.refs
            .clone()
            .unwrap_or_else(|| (self.labels.clone(), self.embeddings.clone()))
    }

    fn slots(&self) -> Vec<u32> {
        match (&self.refs, &self.cfg.self_exclusion) {
            (None, SelfExclusion::Auto) | (_, SelfExclusion::SameIndex) => {
                (0..self.labels.len() as u32).collect()
            }
            (_, SelfExclusion::QuerySlots(s)) => s.clone(),
            _ => vec![u32::MAX; self.labels.len()],
        }
    }

    /// Runs the loss on `ctx` and compares it with the reference scored on the distances
    /// `ctx` computes.
    fn check(&self, ctx: &Context) {
        let (ref_labels, ref_emb) = self.ref_side();
        let queries = MiningSet::new(&self.embeddings, &self.labels);
        let ref_set = self.refs.as_ref().map(|(l, e)| MiningSet::new(e, l));
        let got = triplet_margin_loss(ctx, &queries, ref_set.as_ref(), &self.cfg).expect("loss");
        // Swap runs natively on every context; everything else where the context runs.
        let path = match self.cfg.swap {
            true => ComputePath::NativeCpu,
            false => ctx.path(),
        };
        assert_eq!(got.path, path, "{:?}", self.cfg);
        // The reference is scored on the distances of the path that ran (a wgpu context's
        // may differ from the native path's in the last bits, which decides ties and hinges).
        let native = Context::native_cpu(None);
        let ctx = match path {
            ComputePath::NativeCpu => &native,
            _ => ctx,
        };
        let distances = pairwise_distances(
            ctx,
            &self.embeddings,
            &ref_emb,
            &PairwiseConfig {
                distance: self.cfg.distance,
                ..Default::default()
            },
        )
        .expect("distances")
        .values;
        // Swap's d(r_p, r_n), as `ctx` computes them.
        let ref_distances = self.cfg.swap.then(|| {
            pairwise_distances(
                ctx,
                &ref_emb,
                &ref_emb,
                &PairwiseConfig {
                    distance: self.cfg.distance,
                    ..Default::default()
                },
            )
            .expect("distances")
            .values
        });
        let lists = triplet_lists(
            self.labels.as_slice().expect("contiguous"),
            ref_labels.as_slice().expect("contiguous"),
            &self.slots(),
        );
        let want = reference(
            self.embeddings.view(),
            ref_emb.view(),
            distances.view(),
            ref_distances.as_ref().map(|d| d.view()),
            &lists,
            &self.cfg,
        );
        let what = format!("{:?}", self.cfg);
        assert_eq!(
            (got.triplets, got.nonzero),
            (want.triplets, want.nonzero),
            "{what}: triplets and positive losses"
        );
        let loss_tol = 1e-5 * want.loss.abs().max(1.0);
        assert!(
            (f64::from(got.loss) - want.loss).abs() <= loss_tol,
            "{what}: loss {} vs reference {}",
            got.loss,
            want.loss
        );
        match &self.refs {
            None => {
                let both = &want.query_grad + &want.ref_grad;
                assert_close(&got.query_grad, &both, 2e-4, &what);
                assert!(
                    got.ref_grad.is_none(),
                    "no references, no reference gradient"
                );
            }
            Some(_) => {
                assert_close(&got.query_grad, &want.query_grad, 2e-4, &what);
                match (&got.ref_grad, self.cfg.ref_grad) {
                    (Some(g), true) => assert_close(g, &want.ref_grad, 2e-4, &what),
                    (None, false) => {}
                    (g, asked) => panic!("{what}: ref_grad {:?} when asked {asked}", g.is_some()),
                }
            }
        }
    }
}

/// The kernels' problems (up to 13 queries, 19 references, 5 dimensions), with swap on or off.
fn problem() -> impl Strategy<Value = Problem> {
    (triplet_weights::problem(13, 19, 5), any::<bool>()).prop_map(|(p, swap)| Problem {
        cfg: TripletLossConfig { swap, ..p.cfg },
        ..p
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(192)))]

    #[test]
    fn native_matches_the_materialised_reference(p in problem()) {
        p.check(&Context::native_cpu(None));
    }

    /// The wgpu path (`triplet_weights` and `loss_backward`; swap runs natively) against the
    /// same reference, scored on the device's own distances.
    #[test]
    fn gpu_matches_the_materialised_reference(p in problem()) {
        if let Some(ctx) = common::shared_gpu() {
            p.check(ctx);
        }
    }
}

/// The loss of every triplet written out in f64 straight from the embeddings (normalised),
/// hinge or softplus, with PML's swap or not, averaged over the positive ones: the function
/// whose finite differences the gradient must match.
fn loss_f64(
    x: &Array2<f64>,
    labels: &[u32],
    distance: Distance,
    margin: f64,
    (smooth, swap): (bool, bool),
) -> f64 {
    let n = x.nrows();
    let xs: Vec<_> = x
        .rows()
        .into_iter()
        .map(|r| {
            let norm = r.dot(&r).sqrt();
            r.mapv(|v| v / norm)
        })
        .collect();
    let d = |i: usize, j: usize| {
        let diff = &xs[i] - &xs[j];
        match distance {
            Distance::Euclidean => diff.dot(&diff).sqrt(),
            Distance::SquaredEuclidean => diff.dot(&diff),
            _ => xs[i].dot(&xs[j]),
        }
    };
    let (mut sum, mut count) = (0.0, 0u64);
    for a in 0..n {
        for p in 0..n {
            for q in 0..n {
                if p == a || labels[p] != labels[a] || labels[q] == labels[a] {
                    continue;
                }
                let an = match (swap, distance.is_similarity()) {
                    (false, _) => d(a, q),
                    (true, false) => d(a, q).min(d(p, q)),
                    (true, true) => d(a, q).max(d(p, q)),
                };
                let v = if distance.is_similarity() {
                    an - d(a, p) + margin
                } else {
                    d(a, p) - an + margin
                };
                let loss = if smooth { v.exp().ln_1p() } else { v.max(0.0) };
                if loss > 0.0 {
                    sum += loss;
                    count += 1;
                }
            }
        }
    }
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

#[test]
fn gradient_matches_finite_differences() {
    // Spread points, so that no triplet is within the step of its hinge.
    let x = array![
        [1.0f32, 0.2, -0.3],
        [0.9, 0.5, 0.1],
        [0.1, 1.0, 0.4],
        [-0.2, 0.8, 0.9],
        [0.5, -0.7, 0.6],
        [0.3, 0.1, -1.0]
    ];
    let labels = [0u32, 0, 1, 1, 2, 0];
    let ctx = Context::native_cpu(None);
    for distance in DISTANCES {
        for (margin, smooth, swap) in [
            (0.6f32, false, false),
            (0.2, true, false),
            (1.5, false, false),
            (0.6, false, true),
            (0.2, true, true),
            (1.5, false, true),
        ] {
            let cfg = TripletLossConfig {
                margin,
                smooth_loss: smooth,
                swap,
                distance: DistanceConfig {
                    distance,
                    normalize: true,
                },
                ..Default::default()
            };
            let label_array = Array1::from(labels.to_vec());
            let got = triplet_margin_loss(&ctx, &MiningSet::new(&x, &label_array), None, &cfg)
                .expect("loss");
            assert!(got.nonzero > 0, "{distance:?}: some positive losses");
            let x64 = x.mapv(f64::from);
            let f = |x: &Array2<f64>| loss_f64(x, &labels, distance, margin as f64, (smooth, swap));
            assert!(
                (f(&x64) - f64::from(got.loss)).abs() < 1e-5,
                "{distance:?}: loss value"
            );
            let what = format!("{distance:?} margin {margin} smooth {smooth} swap {swap}");
            common::assert_finite_differences(&x64, f, &got.query_grad, 1e-3, &what);
        }
    }
}

#[test]
fn hinge_ties_and_easy_batches_give_zero() {
    let ctx = Context::native_cpu(None);
    // Raw squared distances on integers: d(a, p) = 1, d(a, n) = 2, so with margin 1 the
    // violation is exactly 0: not a positive loss, no gradient.
    let x = array![[0.0f32, 0.0], [1.0, 0.0], [1.0, 1.0]];
    let labels = array![0u32, 0, 1];
    let raw = DistanceConfig {
        distance: Distance::SquaredEuclidean,
        normalize: false,
    };
    let refs = MiningSet::new(&x, &labels);
    let queries_x = x.slice(ndarray::s![..1, ..]);
    let queries_l = labels.slice(ndarray::s![..1]);
    let queries = MiningSet::new(queries_x, queries_l);
    let at_hinge = TripletLossConfig {
        margin: 1.0,
        distance: raw,
        self_exclusion: SelfExclusion::SameIndex,
        ref_grad: true,
        ..Default::default()
    };
    let out = triplet_margin_loss(&ctx, &queries, Some(&refs), &at_hinge).expect("loss");
    assert_eq!((out.triplets, out.nonzero, out.loss), (1, 0, 0.0));
    assert!(out.query_grad.iter().all(|&g| g == 0.0));
    assert!(out.ref_grad.expect("asked").iter().all(|&g| g == 0.0));
    // Just past the hinge: one positive loss of 2⁻²⁰ (exact in f32).
    let past = TripletLossConfig {
        margin: 1.0 + 2f32.powi(-20),
        ..at_hinge.clone()
    };
    let out = triplet_margin_loss(&ctx, &queries, Some(&refs), &past).expect("loss");
    assert_eq!((out.nonzero, out.loss), (1, 2f32.powi(-20)));
    // ∂/∂q of d(q, p) − d(q, n) = 2(q − p) − 2(q − n) = 2(n − p) = (0, 2).
    assert_eq!(out.query_grad, array![[0.0f32, 2.0]]);
    // An all-easy batch (classes far apart): no positive loss, zero gradient.
    let x = array![[1.0f32, 0.0], [0.99, 0.01], [-1.0, 0.0], [-0.99, -0.01]];
    let labels = array![0u32, 0, 1, 1];
    let out = triplet_margin_loss(
        &ctx,
        &MiningSet::new(&x, &labels),
        None,
        &TripletLossConfig::default(),
    )
    .expect("loss");
    assert_eq!((out.triplets, out.nonzero, out.loss), (8, 0, 0.0));
    assert!(out.query_grad.iter().all(|&g| g == 0.0));
}

#[test]
fn no_triplets_no_loss() {
    let ctx = Context::native_cpu(None);
    let cfg = TripletLossConfig::default();
    // One class: no negatives. No rows at all. No references.
    let x = array![[1.0f32, 0.0], [0.0, 1.0]];
    let one_class = array![3u32, 3];
    let out = triplet_margin_loss(&ctx, &MiningSet::new(&x, &one_class), None, &cfg).expect("loss");
    assert_eq!((out.triplets, out.nonzero, out.loss), (0, 0, 0.0));
    assert_eq!(out.query_grad, Array2::<f32>::zeros((2, 2)));
    let empty = Array2::<f32>::zeros((0, 2));
    let no_labels = Array1::<u32>::zeros(0);
    let out =
        triplet_margin_loss(&ctx, &MiningSet::new(&empty, &no_labels), None, &cfg).expect("loss");
    assert_eq!((out.triplets, out.query_grad.dim()), (0, (0, 2)));
    let with_refs = TripletLossConfig {
        ref_grad: true,
        ..cfg
    };
    let out = triplet_margin_loss(
        &ctx,
        &MiningSet::new(&x, &one_class),
        Some(&MiningSet::new(&empty, &no_labels)),
        &with_refs,
    )
    .expect("loss");
    assert_eq!(out.triplets, 0);
    assert_eq!(out.ref_grad.map(|g| g.dim()), Some((0, 2)));
}

/// A clustered problem big enough for several blocks.
fn clustered(
    b: usize,
    m: usize,
    d: usize,
    seed: u64,
) -> (Array2<f32>, Array1<u32>, Array2<f32>, Array1<u32>) {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    };
    let mut rows = |n: usize| {
        let labels: Array1<u32> = (0..n).map(|i| (i % 5) as u32).collect();
        let x = Array2::from_shape_fn((n, d), |(i, j)| {
            next()
                + if j == labels[i] as usize % d {
                    1.0
                } else {
                    0.0
                }
        });
        (x, labels)
    };
    let (q, ql) = rows(b);
    let (r, rl) = rows(m);
    (q, ql, r, rl)
}

#[test]
fn small_budgets_split_into_blocks_with_the_same_answer() {
    let (q, ql, r, rl) = clustered(40, 300, 8, 7);
    let queries = MiningSet::new(&q, &ql);
    let refs = MiningSet::new(&r, &rl);
    let cfg = TripletLossConfig {
        margin: 0.3,
        ref_grad: true,
        ..Default::default()
    };
    let whole =
        triplet_margin_loss(&Context::native_cpu(None), &queries, Some(&refs), &cfg).expect("loss");
    // Room for the fixed part and a few rows of distances only.
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()) as u64;
    let base = 4 * 8 * (2 * 40 + 2 * 300);
    let fixed = base + threads * 300 * 48;
    // Per block row: its distances (4 bytes) and its possible near pairs (16) per reference,
    // and 16 bytes of its own (its place in the order by label, an SNR scale).
    let budget = fixed + 3 * (20 * 300 + 16);
    let ctx = Context::native_cpu(Some(budget));
    let split = triplet_margin_loss(&ctx, &queries, Some(&refs), &cfg).expect("loss");
    assert!(
        ctx.memory().peak_bytes <= budget,
        "peak {} over {budget}",
        ctx.memory().peak_bytes
    );
    assert_eq!(
        (split.triplets, split.nonzero),
        (whole.triplets, whole.nonzero)
    );
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs());
    let close = |a: &Array2<f32>, b: &Array2<f32>| {
        a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
    };
    assert!(close(&split.query_grad, &whole.query_grad));
    assert!(close(
        split.ref_grad.as_ref().expect("asked"),
        whole.ref_grad.as_ref().expect("asked")
    ));
    // The least is one thread's scratch and one block row, whatever the cores: it runs there
    // (on one thread) with the same answer, and one byte less is refused, naming it.
    let least = base + (300 * 48 + 16) + 20 * 300 + 16;
    let one = triplet_margin_loss(
        &Context::native_cpu(Some(least)),
        &queries,
        Some(&refs),
        &cfg,
    )
    .expect("one thread fits");
    assert_eq!((one.triplets, one.nonzero), (whole.triplets, whole.nonzero));
    assert!(close(&one.query_grad, &whole.query_grad));
    match triplet_margin_loss(
        &Context::native_cpu(Some(least - 1)),
        &queries,
        Some(&refs),
        &cfg,
    ) {
        Err(Error::OverBudget {
            required,
            budget: b,
            ..
        }) => assert_eq!((required, b), (least, least - 1)),
        other => panic!("expected OverBudget, got {other:?}"),
    }
    // With swap, over one block and over several: each thread's reference-pair gradient is
    // kept from block to block and added once. Its scratch: 32 positives' indices, raw and
    // normalised rows, own gradients, distances and weights, near pairs, an (m, d) gradient.
    let swap = TripletLossConfig {
        swap: true,
        ..cfg.clone()
    };
    let whole = triplet_margin_loss(&Context::native_cpu(None), &queries, Some(&refs), &swap)
        .expect("loss");
    let pairs = 32 * 4 + 3 * 32 * 8 * 4 + 32 * 300 * (4 + 8 + 16) + 300 * 8 * 4;
    let budget = fixed + threads * (16 + pairs) + 3 * (20 * 300 + 16);
    let ctx = Context::native_cpu(Some(budget));
    let split = triplet_margin_loss(&ctx, &queries, Some(&refs), &swap).expect("loss");
    assert!(ctx.memory().peak_bytes <= budget);
    assert_eq!(
        (split.triplets, split.nonzero),
        (whole.triplets, whole.nonzero)
    );
    assert!((split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs());
    assert!(close(&split.query_grad, &whole.query_grad));
    assert!(close(
        split.ref_grad.as_ref().expect("asked"),
        whole.ref_grad.as_ref().expect("asked")
    ));
    assert_ne!(split.loss, one.loss, "the swap changes this loss");
}

/// `a` and `b` agree to `tol` relative (per element, against 1 + |b|).
fn close(a: &Array2<f32>, b: &Array2<f32>, tol: f32) -> bool {
    a.dim() == b.dim()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// A context on `probe`'s adapter that allows 3 workgroups per dispatch dimension.
fn three_workgroups_per_dimension(probe: &Context) -> Context {
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 3,
        ..probe.limits().cloned().expect("wgpu context has limits")
    };
    common::gpu_context_with(ContextConfig {
        limits: Some(limits),
        ..Default::default()
    })
    .expect("an adapter accepts lower limits")
}

#[test]
fn gpu_blocks_under_a_small_budget_and_a_tiny_workgroup_limit_give_the_whole_answer() {
    let Some(probe) = common::shared_gpu() else {
        return;
    };
    // 140 references fit one page under a limit of 3 workgroups per dimension (3 × 64 rows
    // of distance tiles) and their 9 tiles of 16 fold into 3 × 3; the anchors take blocks of
    // at most 9, folded likewise.
    let (q, ql, r, rl) = clustered(70, 140, 8, 7);
    let queries = MiningSet::new(&q, &ql);
    let refs = MiningSet::new(&r, &rl);
    for cfg in [
        TripletLossConfig {
            margin: 0.3,
            ref_grad: true,
            ..Default::default()
        },
        TripletLossConfig {
            triplets: TripletRule::margin_miner(TripletType::Semihard),
            smooth_loss: true,
            distance: DistanceConfig {
                distance: Distance::Cosine,
                normalize: true,
            },
            ref_grad: true,
            ..Default::default()
        },
    ] {
        let native = triplet_margin_loss(&Context::native_cpu(None), &queries, Some(&refs), &cfg)
            .expect("native");
        let whole = triplet_margin_loss(probe, &queries, Some(&refs), &cfg).expect("whole");
        assert_eq!(whole.path, ComputePath::Wgpu);
        let budget = 64 << 10;
        let small = common::gpu_context(Some(budget)).expect("a budgeted context");
        let tiny = three_workgroups_per_dimension(probe);
        for (ctx, what) in [(&small, "small budget"), (&tiny, "tiny workgroup limit")] {
            let split = triplet_margin_loss(ctx, &queries, Some(&refs), &cfg).expect(what);
            assert_eq!(split.path, ComputePath::Wgpu, "{what}");
            assert_eq!(
                (split.triplets, split.nonzero),
                (whole.triplets, whole.nonzero),
                "{what}"
            );
            assert!(
                (split.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs(),
                "{what}"
            );
            assert!(close(&split.query_grad, &whole.query_grad, 1e-5), "{what}");
            let (s, w) = (split.ref_grad.as_ref(), whole.ref_grad.as_ref());
            assert!(close(s.expect("asked"), w.expect("asked"), 1e-5), "{what}");
        }
        assert!(
            small.memory().peak_bytes <= budget,
            "peak {} over {budget}",
            small.memory().peak_bytes
        );
        // Several blocks: a submission each.
        let split = triplet_margin_loss(&small, &queries, Some(&refs), &cfg).expect("again");
        assert!(split.transfers.submissions >= 3, "{:?}", split.transfers);
        // The device's answer is the native path's, to f32 rounding.
        assert_eq!(
            (whole.triplets, whole.nonzero),
            (native.triplets, native.nonzero)
        );
        assert!((whole.loss - native.loss).abs() <= 1e-5 * native.loss.abs());
        assert!(close(&whole.query_grad, &native.query_grad, 1e-4));
    }
    // 300 references take two pages under that limit: the loss runs natively there.
    let (q, ql, r, rl) = clustered(10, 300, 8, 3);
    let tiny = three_workgroups_per_dimension(probe);
    let out = triplet_margin_loss(
        &tiny,
        &MiningSet::new(&q, &ql),
        Some(&MiningSet::new(&r, &rl)),
        &TripletLossConfig::default(),
    )
    .expect("paged references");
    assert_eq!(out.path, ComputePath::NativeCpu);
}

#[test]
fn queries_as_references_sum_both_roles() {
    // refs = None equals explicit refs (the same rows, SameIndex) with the two gradients added.
    let (q, ql, _, _) = clustered(30, 1, 6, 3);
    let ctx = Context::native_cpu(None);
    let cfg = TripletLossConfig {
        margin: 0.4,
        smooth_loss: true,
        ..Default::default()
    };
    let set = MiningSet::new(&q, &ql);
    let own = triplet_margin_loss(&ctx, &set, None, &cfg).expect("loss");
    let explicit = TripletLossConfig {
        self_exclusion: SelfExclusion::SameIndex,
        ref_grad: true,
        ..cfg
    };
    let split = triplet_margin_loss(&ctx, &set, Some(&set), &explicit).expect("loss");
    assert_eq!(own.loss, split.loss);
    let sum = &split.query_grad + split.ref_grad.as_ref().expect("asked");
    for (a, b) in own.query_grad.iter().zip(&sum) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{a} vs {b}");
    }
}

#[test]
fn a_memory_bank_is_a_detached_reference_set() {
    // The batch enqueued into a bank, then the loss of the batch against the bank with the
    // bank's self-exclusion: equal to the loss against the same rows given from the host.
    let (q, ql, r, rl) = clustered(16, 48, 6, 11);
    let mut contexts = vec![Context::native_cpu(None)];
    contexts.extend(common::gpu_context(None));
    let mut answers = Vec::new();
    for ctx in &contexts {
        let mut bank = MemoryBank::<u32>::new(ctx, &BankConfig::new(64, 6)).expect("bank");
        bank.enqueue(ctx, &MiningSet::new(&r, &rl)).expect("fill");
        let slots = bank.enqueue(ctx, &MiningSet::new(&q, &ql)).expect("batch");
        let cfg = TripletLossConfig {
            self_exclusion: slots.self_exclusion.clone(),
            triplets: TripletRule::margin_miner(TripletType::Semihard),
            ..Default::default()
        };
        let bank_set = bank.refs();
        let got = triplet_margin_loss(ctx, &MiningSet::new(&q, &ql), Some(&bank_set), &cfg)
            .expect("loss");
        assert_eq!(got.path, ctx.path(), "the loss runs where the context does");
        let snapshot = bank.snapshot(ctx).expect("snapshot");
        let host = MiningSet::new(&snapshot.embeddings, &snapshot.labels);
        let want =
            triplet_margin_loss(ctx, &MiningSet::new(&q, &ql), Some(&host), &cfg).expect("loss");
        assert!(got.triplets > 0 && got.nonzero > 0);
        assert_eq!(
            (got.triplets, got.nonzero, got.loss),
            (want.triplets, want.nonzero, want.loss)
        );
        assert_eq!(got.query_grad, want.query_grad);
        if ctx.path() == ComputePath::Wgpu {
            // The bank's rows stay on the device: only the anchors' gradient `(16, 8)` padded
            // and their sums come back, less than the bank's 64 rows.
            assert!(
                got.transfers.bytes_down > 0 && got.transfers.bytes_down < 64 * 6 * 4,
                "{:?}",
                got.transfers
            );
        }
        answers.push(got);
    }
    // The GPU context's bank gives the native context's answer.
    if let [native, gpu] = &answers[..] {
        assert_eq!(
            (native.triplets, native.nonzero),
            (gpu.triplets, gpu.nonzero)
        );
    }
}

#[test]
fn bad_inputs_and_cancellation_are_typed_errors() {
    let ctx = Context::native_cpu(None);
    let x = array![[1.0f32, 0.0], [0.0, 1.0], [0.5, 0.5]];
    let labels = array![0u32, 0, 1];
    let set = MiningSet::new(&x, &labels);
    let nan_margin = TripletLossConfig {
        margin: f32::NAN,
        ..Default::default()
    };
    assert!(matches!(
        triplet_margin_loss(&ctx, &set, None, &nan_margin),
        Err(Error::InvalidParameter { .. })
    ));
    let labels_only = MiningSet::<u32>::from_labels(&labels);
    assert!(matches!(
        triplet_margin_loss(&ctx, &labels_only, None, &TripletLossConfig::default()),
        Err(Error::InvalidParameter { .. })
    ));
    let bad = array![[f32::INFINITY, 0.0], [0.0, 1.0], [0.5, 0.5]];
    assert!(matches!(
        triplet_margin_loss(
            &ctx,
            &MiningSet::new(&bad, &labels),
            None,
            &TripletLossConfig::default()
        ),
        Err(Error::NonFinite { .. })
    ));
    let token = CancelToken::new();
    token.cancel();
    let cancelled = TripletLossConfig {
        hooks: Hooks::new().cancel_with(&token),
        ..Default::default()
    };
    assert!(matches!(
        triplet_margin_loss(&ctx, &set, None, &cancelled),
        Err(Error::Cancelled { .. })
    ));
}

#[test]
fn swap_takes_the_smaller_distance_and_splits_ties_as_torch() {
    // One anchor a = (0, 0) against references p = (2, 0) (its class) and n, raw squared
    // distances on integers (exact): d(a, p) = 4, margin 20.
    let ctx = Context::native_cpu(None);
    let (a, al) = (array![[0.0f32, 0.0]], array![0u32]);
    let cfg = TripletLossConfig {
        margin: 20.0,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        swap: true,
        ref_grad: true,
        ..Default::default()
    };
    // (n, loss, ∂/∂a, ∂/∂p, ∂/∂n). n = (1, 3): d(a, n) = d(p, n) = 10, a tie, each half the
    // gradient. n = (2, 1): d(p, n) = 1 < d(a, n) = 5, all of it through d(p, n).
    let cases = [
        (
            [1.0f32, 3.0],
            14.0f32,
            [-3.0f32, 3.0],
            [3.0f32, 3.0],
            [0.0f32, -6.0],
        ),
        ([2.0, 1.0], 23.0, [-4.0, 0.0], [4.0, 2.0], [0.0, -2.0]),
    ];
    for (n, loss, ga, gp, gn) in cases {
        let refs = array![[2.0f32, 0.0], [n[0], n[1]]];
        let rl = array![0u32, 1];
        let out = triplet_margin_loss(
            &ctx,
            &MiningSet::new(&a, &al),
            Some(&MiningSet::new(&refs, &rl)),
            &cfg,
        )
        .expect("loss");
        assert_eq!((out.triplets, out.nonzero, out.loss), (1, 1, loss), "{n:?}");
        assert_eq!(out.query_grad, array![ga], "{n:?}: the anchor");
        assert_eq!(
            out.ref_grad.expect("asked"),
            array![gp, gn],
            "{n:?}: p and n"
        );
        // Without swap the negative's distance is d(a, n), whatever d(p, n).
        let plain = TripletLossConfig {
            swap: false,
            ..cfg.clone()
        };
        let out = triplet_margin_loss(
            &ctx,
            &MiningSet::new(&a, &al),
            Some(&MiningSet::new(&refs, &rl)),
            &plain,
        )
        .expect("loss");
        let an = n[0] * n[0] + n[1] * n[1];
        assert_eq!(out.loss, 4.0 - an + 20.0, "{n:?} without swap");
    }
}

#[test]
fn near_duplicates_get_the_exact_gradient() {
    // A positive 1e-4 away from its anchor: |q̂|² + |p̂|² − 2 q̂·p̂ has lost every digit to
    // cancellation, so its pair's gradient (q̂ − p̂) / D must come from the difference itself.
    let anchor_pair = array![
        [1.0f32, 0.5, 0.25],
        [1.0001, 0.4998, 0.25],
        [-0.2, 1.0, 0.3],
        [0.1, -0.3, 1.0]
    ];
    // With swap, a negative 1e-4 away from a positive: d(r_p, r_n) is near zero and wins the
    // swap (for (0, 1, 2)); its gradient must come from the difference too.
    let reference_pair = array![
        [1.0f32, 0.5, 0.25],
        [-0.3, 1.0, 0.2],
        [-0.2999, 1.0001, 0.2],
        [0.1, -0.3, 1.0]
    ];
    let labels = array![0u32, 0, 1, 2];
    // The wgpu path recomputes the near pair's distance from the rows in `triplet_weights`
    // and sums the gradient as differences in `loss_backward` (swap runs natively).
    let contexts = [Some(Context::native_cpu(None)), common::gpu_context(None)];
    let cases = [(anchor_pair, false), (reference_pair, true)];
    for (ctx, (x, swap)) in contexts
        .iter()
        .flatten()
        .flat_map(|ctx| cases.iter().map(move |case| (ctx, case)))
    {
        let (x, swap) = (x.clone(), *swap);
        let cfg = TripletLossConfig {
            margin: 2.0,
            swap,
            ..Default::default()
        };
        let got = triplet_margin_loss(ctx, &MiningSet::new(&x, &labels), None, &cfg).expect("loss");
        let d = pairwise_distances(ctx, &x, &x, &PairwiseConfig::default())
            .expect("distances")
            .values;
        assert!(
            !swap || d[[1, 2]] < d[[0, 2]],
            "the swap wins for (0, 1, 2)"
        );
        let lists = triplet_lists(
            labels.as_slice().expect("contiguous"),
            labels.as_slice().expect("contiguous"),
            &[0, 1, 2, 3],
        );
        let want = reference(x.view(), x.view(), d.view(), Some(d.view()), &lists, &cfg);
        assert_eq!(got.nonzero, want.nonzero);
        assert!(want.nonzero > 0);
        assert_close(
            &got.query_grad,
            &(&want.query_grad + &want.ref_grad),
            1e-4,
            &format!("near duplicates, swap {swap}, {:?}", got.path),
        );
    }
}

//! The `*_plan` queries tell the truth: on both paths, the call then holds no more than the
//! plan's `bytes` (within the budget), and a context whose budget is the plan's `min_bytes`
//! runs the call while one byte less refuses it with `OverBudget`.

use crate::common;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, accuracy_plan, classifier_loss, classifier_loss_plan, kmeans, kmeans_plan, knn,
    knn_plan, mine, mine_plan, mine_triplets, mine_triplets_plan, multiple_negatives_ranking_loss,
    multiple_negatives_ranking_loss_plan, ntxent_loss, ntxent_loss_plan, pair_loss, pair_loss_plan,
    pair_margin_pairs, pairwise_distances, pairwise_distances_plan, triplet_margin_loss,
    triplet_margin_loss_plan, AccuracyConfig, AccuracyK, BackendChoice, ClassifierKind,
    ClassifierLossConfig, ComputePath, Context, ContextConfig, Contrastive, Error, Histogram,
    InfoNceConfig, Instance, KmeansConfig, KnnConfig, LiftedStructure, MiningSet, MnrlConfig,
    PairLossConfig, PairMarginConfig, Plan, Result, SupCon, TripletConfig, TripletLossConfig,
    TripletType, Tuning, TupletMargin,
};

fn data(rows: usize, d: usize, classes: usize) -> (Array2<f32>, Array1<u32>) {
    let x = Array2::from_shape_fn((rows, d), |(i, k)| {
        ((i as f32 * 0.37 + k as f32 * 1.13).sin() * 3.0).fract()
    });
    let y = Array1::from_shape_fn(rows, |i| (i % classes) as u32);
    (x, y)
}

/// A context on `path` with `budget` bytes (the GPU one with sentinels, as every GPU test, and
/// tuning its distance kernel inside the calls, as on a hardware GPU, whatever the adapter).
fn context(path: ComputePath, budget: u64) -> Option<Context> {
    match path {
        ComputePath::NativeCpu => Some(Context::native_cpu(Some(budget))),
        ComputePath::Wgpu => common::gpu_context_with(ContextConfig {
            backend: BackendChoice::Wgpu,
            budget_bytes: Some(budget),
            tuning: Tuning::Eager,
            ..Default::default()
        }),
    }
}

/// Plans on a context of `budget`, runs, and checks the peak against the plan; then runs on
/// contexts of exactly `min_bytes` and one byte less.
fn check<T>(
    what: &str,
    path: ComputePath,
    budget: u64,
    plan: impl Fn(&Context) -> Result<Plan>,
    run: impl Fn(&Context) -> Result<T>,
) {
    let Some(ctx) = context(path, budget) else {
        return;
    };
    let p = plan(&ctx).unwrap_or_else(|e| panic!("{what} on {path:?}: plan: {e}"));
    assert_eq!(p.path, path, "{what}: the plan says where it runs");
    assert!(
        p.min_bytes <= p.bytes && p.bytes <= budget,
        "{what} on {path:?}: {p:?}"
    );
    assert!(p.rows >= 1 && p.chunks >= 1, "{what} on {path:?}: {p:?}");
    ctx.reset_peak();
    run(&ctx).unwrap_or_else(|e| panic!("{what} on {path:?}: {e}"));
    let peak = ctx.memory().peak_bytes;
    assert!(
        peak <= p.bytes,
        "{what} on {path:?}: peak {peak} above the plan's {p:?}"
    );
    let Some(tight) = context(path, p.min_bytes) else {
        return;
    };
    run(&tight)
        .unwrap_or_else(|e| panic!("{what} on {path:?} with min_bytes {}: {e}", p.min_bytes));
    if p.min_bytes > 0 {
        let Some(short) = context(path, p.min_bytes - 1) else {
            return;
        };
        match run(&short) {
            Err(Error::OverBudget { required, .. }) => {
                assert!(required > p.min_bytes - 1, "{what}: names what it needs")
            }
            // k-means holds its host rows before each search plans in what is left: one byte
            // short, the search's scratch is the reservation that fails.
            Err(Error::BudgetExceeded { .. }) if what == "kmeans" => {}
            Err(e) => panic!("{what} on {path:?} one byte short: expected OverBudget, got {e}"),
            Ok(_) => panic!("{what} on {path:?} one byte short of min_bytes ran"),
        }
    }
}

#[test]
fn plans_bound_what_the_calls_hold_and_name_their_least_budget() {
    let (x, y) = data(90, 12, 6);
    let (r, ry) = data(70, 12, 6);
    let set = MiningSet::new(&x, &y);
    let refs = MiningSet::new(&r, &ry);
    let knn_cfg = KnnConfig {
        k: 4,
        ..Default::default()
    };
    let semihard = TripletConfig::margin_miner(TripletType::Semihard);
    let acc = AccuracyConfig {
        k: AccuracyK::MaxBinCount,
        ..Default::default()
    };
    for path in [ComputePath::NativeCpu, ComputePath::Wgpu] {
        let budget = 8 << 20;
        check(
            "pairwise_distances",
            path,
            budget,
            |ctx| pairwise_distances_plan(ctx, &x, &r, &Default::default()),
            |ctx| pairwise_distances(ctx, &x, &r, &Default::default()),
        );
        check(
            "knn",
            path,
            budget,
            |ctx| knn_plan(ctx, &x, &r, &knn_cfg),
            |ctx| knn(ctx, &x, &r, &knn_cfg),
        );
        // k = 1 runs the native path's fused top-1 kernel where its scratch fits (here), the
        // general one below that (at min_bytes).
        let top1 = KnnConfig {
            k: 1,
            ..Default::default()
        };
        check(
            "knn k = 1",
            path,
            budget,
            |ctx| knn_plan(ctx, &x, &r, &top1),
            |ctx| knn(ctx, &x, &r, &top1),
        );
        // Three references of one dimension: the fused kernel's one-row plan (a 32-reference
        // chunk) is below the general path's, so it is the least budget.
        let (x1, _) = data(5, 1, 1);
        let (r1, _) = data(3, 1, 1);
        check(
            "knn k = 1, tiny",
            path,
            budget,
            |ctx| knn_plan(ctx, &x1, &r1, &top1),
            |ctx| knn(ctx, &x1, &r1, &top1),
        );
        check(
            "accuracy",
            path,
            budget,
            |ctx| accuracy_plan(ctx, &set, Some(&refs), &acc),
            |ctx| accuracy(ctx, &set, Some(&refs), &acc),
        );
        check(
            "mine_triplets",
            path,
            budget,
            |ctx| mine_triplets_plan(ctx, &set, Some(&refs), &semihard),
            |ctx| mine_triplets(ctx, &set, Some(&refs), &semihard),
        );
        check(
            "pair_margin_pairs",
            path,
            budget,
            |ctx| mine_plan(ctx, &set, Some(&refs), &PairMarginConfig::default()),
            |ctx| pair_margin_pairs(ctx, &set, Some(&refs), &PairMarginConfig::default()),
        );
        check(
            "mine (triplets)",
            path,
            budget,
            |ctx| mine_plan(ctx, &set, Some(&refs), &semihard),
            |ctx| mine(ctx, &set, Some(&refs), &semihard),
        );
        let clusters = KmeansConfig {
            clusters: 7,
            ..Default::default()
        };
        check(
            "kmeans",
            path,
            budget,
            |ctx| kmeans_plan(ctx, &x, &clusters),
            |ctx| kmeans(ctx, &x, &clusters),
        );
        losses(path, budget, (&set, &refs));
    }
}

/// The losses' plans, in-batch and against references.
fn losses<'a>(
    path: ComputePath,
    budget: u64,
    (set, refs): (&MiningSet<'a, u32>, &MiningSet<'a, u32>),
) {
    let ntxent = InfoNceConfig::default();
    check(
        "ntxent_loss",
        path,
        budget,
        |ctx| ntxent_loss_plan(ctx, set, None, &ntxent),
        |ctx| ntxent_loss(ctx, set, None, &ntxent),
    );
    let with_ref_grad = InfoNceConfig {
        ref_grad: true,
        ..Default::default()
    };
    check(
        "ntxent_loss against references",
        path,
        budget,
        |ctx| ntxent_loss_plan(ctx, set, Some(refs), &with_ref_grad),
        |ctx| ntxent_loss(ctx, set, Some(refs), &with_ref_grad),
    );
    let (anchors, candidates) = (
        refs.embeddings.expect("rows"),
        set.embeddings.expect("rows"),
    );
    let mnrl = MnrlConfig::default();
    check(
        "multiple_negatives_ranking_loss",
        path,
        budget,
        |ctx| multiple_negatives_ranking_loss_plan(ctx, anchors, candidates, &mnrl),
        |ctx| multiple_negatives_ranking_loss(ctx, anchors, candidates, &mnrl),
    );
    let triplet = TripletLossConfig::default();
    check(
        "triplet_margin_loss",
        path,
        budget,
        |ctx| triplet_margin_loss_plan(ctx, set, Some(refs), &triplet),
        |ctx| triplet_margin_loss(ctx, set, Some(refs), &triplet),
    );
    // Swap runs natively on every context: its plan says so.
    let swap = TripletLossConfig {
        swap: true,
        ..Default::default()
    };
    match path {
        ComputePath::NativeCpu => check(
            "triplet_margin_loss with swap",
            path,
            budget,
            |ctx| triplet_margin_loss_plan(ctx, set, None, &swap),
            |ctx| triplet_margin_loss(ctx, set, None, &swap),
        ),
        ComputePath::Wgpu => {
            let Some(ctx) = context(path, budget) else {
                return;
            };
            let plan = triplet_margin_loss_plan(&ctx, set, None, &swap).expect("plan");
            let out = triplet_margin_loss(&ctx, set, None, &swap).expect("loss");
            assert_eq!(
                (plan.path, out.path),
                (ComputePath::NativeCpu, ComputePath::NativeCpu)
            );
        }
    }
    pair_losses(path, budget, (set, refs));
}

/// The pair losses with a device rule run on the context's path (two passes for
/// Contrastive), the others natively on every context: their plans say so, and hold.
fn pair_losses<'a>(
    path: ComputePath,
    budget: u64,
    (set, refs): (&MiningSet<'a, u32>, &MiningSet<'a, u32>),
) {
    let contrastive = PairLossConfig::<Contrastive>::default();
    let supcon = PairLossConfig::<SupCon> {
        ref_grad: true,
        ..Default::default()
    };
    check(
        "pair_loss (contrastive)",
        path,
        budget,
        |ctx| pair_loss_plan(ctx, set, None, &contrastive),
        |ctx| pair_loss(ctx, set, None, &contrastive),
    );
    check(
        "pair_loss (supcon) against references",
        path,
        budget,
        |ctx| pair_loss_plan(ctx, set, Some(refs), &supcon),
        |ctx| pair_loss(ctx, set, Some(refs), &supcon),
    );
    // InstanceLoss runs its relabelled batch through the device's `SOFTMAX` rule.
    let instance = PairLossConfig::<Instance>::default();
    check(
        "pair_loss (instance)",
        path,
        budget,
        |ctx| pair_loss_plan(ctx, set, None, &instance),
        |ctx| pair_loss(ctx, set, None, &instance),
    );
    // The losses with class weights: ArcFace and ProxyNCA have a device path, SoftTriple not;
    // every row's class among 9.
    let labels: Vec<i64> = set.labels.iter().map(|&y| i64::from(y) % 9).collect();
    // The batch's rows, as the caller made them.
    let (x, _) = data(90, 12, 6);
    for kind in [
        ClassifierKind::arc_face(),
        ClassifierKind::proxy_nca(),
        ClassifierKind::soft_triple(),
    ] {
        let (rows, cols) = kind.weight_shape(9, x.ncols());
        let w = Array2::from_shape_fn((rows, cols), |(i, j)| ((i * 7 + j * 3) % 11) as f32 - 5.0);
        let cfg = ClassifierLossConfig {
            kind,
            ..Default::default()
        };
        let want = match kind {
            ClassifierKind::SoftTriple { .. } => ComputePath::NativeCpu,
            _ => path,
        };
        check(
            &format!("classifier_loss ({kind:?})"),
            want,
            budget,
            |ctx| classifier_loss_plan(ctx, x.view(), &labels, w.view(), &cfg),
            |ctx| classifier_loss(ctx, x.view(), &labels, w.view(), &cfg),
        );
    }
    let lifted = PairLossConfig::<LiftedStructure>::default();
    check(
        "pair_loss (lifted structure)",
        path,
        budget,
        |ctx| pair_loss_plan(ctx, set, None, &lifted),
        |ctx| pair_loss(ctx, set, None, &lifted),
    );
    let histogram = PairLossConfig::<Histogram>::default();
    check(
        "pair_loss (histogram)",
        path,
        budget,
        |ctx| pair_loss_plan(ctx, set, None, &histogram),
        |ctx| pair_loss(ctx, set, None, &histogram),
    );
    if path == ComputePath::Wgpu {
        let Some(ctx) = context(path, budget) else {
            return;
        };
        // The rules with a device path ran there (`check` asserts the plans' path only).
        let ran = (
            pair_loss(&ctx, set, None, &contrastive)
                .expect("contrastive")
                .path,
            pair_loss(&ctx, set, None, &lifted).expect("lifted").path,
        );
        assert_eq!(ran, (ComputePath::Wgpu, ComputePath::Wgpu));
        let tuplet = PairLossConfig::<TupletMargin>::default();
        let plan = pair_loss_plan(&ctx, set, Some(refs), &tuplet).expect("plan");
        ctx.reset_peak();
        let out = pair_loss(&ctx, set, Some(refs), &tuplet).expect("loss");
        assert_eq!(
            (plan.path, out.path),
            (ComputePath::NativeCpu, ComputePath::NativeCpu)
        );
        assert!(ctx.memory().peak_bytes <= plan.bytes, "{plan:?}");
    }
}

#[test]
fn a_plan_under_a_smaller_budget_takes_more_chunks() {
    let (x, _) = data(2000, 32, 10);
    let cfg = KnnConfig::default();
    for path in [ComputePath::NativeCpu, ComputePath::Wgpu] {
        let (Some(roomy), Some(tight)) = (context(path, 256 << 20), context(path, 1 << 20)) else {
            continue;
        };
        let a = knn_plan(&roomy, &x, &x, &cfg).expect("roomy");
        let b = knn_plan(&tight, &x, &x, &cfg).expect("tight");
        assert!(b.bytes <= 1 << 20, "{path:?}: {b:?}");
        assert!(b.chunks > a.chunks, "{path:?}: {a:?} then {b:?}");
    }
}

//! Shared test helpers: the GPU context (forced onto wgpu so kernels run even on lavapipe) and
//! tolerance checks.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::sync::OnceLock;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{BackendChoice, Context, ContextConfig, Distance};

/// Whether the environment demands a GPU (`WML_REQUIRE_GPU=1`, set by `.ci/run`).
pub(crate) fn gpu_required() -> bool {
    std::env::var("WML_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// A wgpu context with `budget` bytes (default: the adapter's), sentinels on, or `None` with a
/// printed notice when there is no adapter. Panics when `WML_REQUIRE_GPU=1` and none is found,
/// so CI cannot pass by skipping.
pub(crate) fn gpu_context_with(config: ContextConfig) -> Option<Context> {
    open_gpu(ContextConfig {
        fill_outputs_with_sentinel: true,
        ..config
    })
}

/// As [`gpu_context`], without sentinels: outputs are not pre-filled, as in production (for
/// tests that count submissions and bytes).
pub(crate) fn gpu_context_as_shipped(budget: Option<u64>) -> Option<Context> {
    open_gpu(ContextConfig {
        budget_bytes: budget,
        ..Default::default()
    })
}

fn open_gpu(config: ContextConfig) -> Option<Context> {
    let config = ContextConfig {
        backend: BackendChoice::Wgpu,
        ..config
    };
    match Context::new(&config) {
        Ok(ctx) => Some(ctx),
        Err(e) if gpu_required() => panic!("WML_REQUIRE_GPU=1 but no GPU context: {e}"),
        Err(e) => {
            eprintln!("skipped: no adapter ({e})");
            None
        }
    }
}

/// A context with its own budget.
pub(crate) fn gpu_context(budget: Option<u64>) -> Option<Context> {
    gpu_context_with(ContextConfig {
        budget_bytes: budget,
        ..Default::default()
    })
}

/// One shared context per test binary (device creation costs tens of milliseconds).
pub(crate) fn shared_gpu() -> Option<&'static Context> {
    static CTX: OnceLock<Option<Context>> = OnceLock::new();
    CTX.get_or_init(|| {
        let ctx = gpu_context(None)?;
        eprintln!("GPU tests run on: {}", ctx.device_name());
        Some(ctx)
    })
    .as_ref()
}

/// Proptest case count: `PROPTEST_CASES` if set, else `default` (small: lavapipe is slow).
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `x` `(n, d)` written into a new buffer at byte `offset`, rows `stride` floats apart; the
/// gaps hold NaN, so a kernel that read them would fail or return NaN.
pub(crate) fn upload(ctx: &Context, x: &Array2<f32>, offset: u64, stride: usize) -> wgpu::Buffer {
    let (device, queue) = ctx.wgpu_device().expect("a wgpu context");
    let n = x.nrows();
    let floats = offset as usize / 4 + n * stride;
    let mut data = vec![f32::NAN; floats.max(1)];
    for (i, row) in x.rows().into_iter().enumerate() {
        let at = offset as usize / 4 + i * stride;
        for (k, v) in row.iter().enumerate() {
            data[at + k] = *v;
        }
    }
    let buffer = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("test embeddings"),
        size: 4 * data.len() as u64,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    queue.write_buffer(&buffer, 0, &bytes);
    buffer
}

/// Every distance the library offers.
pub(crate) const DISTANCES: [Distance; 4] = [
    Distance::Euclidean,
    Distance::SquaredEuclidean,
    Distance::Cosine,
    Distance::DotProduct,
];

/// Rows on a coarse grid (values -2..=2: many ties between distances) and labels in `classes`
/// classes, from `seed`.
pub(crate) fn grid_data(
    n: usize,
    d: usize,
    classes: usize,
    seed: u64,
) -> (Array2<f32>, Array1<u32>) {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let x = Array2::from_shape_fn((n, d), |_| (next() % 5) as f32 - 2.0);
    let y = Array1::from_shape_fn(n, |_| (next() % classes as u64) as u32);
    (x, y)
}

/// A bank of 256 rows filled from `x` `(300, d)` in two overlapping batches (rows 0..200,
/// then 100..300: it wraps), for tests that mine against bank references.
pub(crate) fn wrapped_bank(
    ctx: &Context,
    x: &Array2<f32>,
    y: &Array1<u32>,
) -> wgpu_metric_learning::MemoryBank<u32> {
    use ndarray::s;
    use wgpu_metric_learning::{BankConfig, MemoryBank, MiningSet};
    let config = BankConfig::new(256, x.ncols());
    let mut bank = MemoryBank::<u32>::new(ctx, &config).expect("bank");
    for range in [0..200, 100..300] {
        let batch = MiningSet::new(x.slice(s![range.clone(), ..]), y.slice(s![range]));
        bank.enqueue(ctx, &batch).expect("enqueue");
    }
    bank
}

/// `|got − want| ≤ tol · max(1, max |want|)` element-wise: a loss gradient against its f64
/// reference.
pub(crate) fn assert_close(got: &Array2<f32>, want: &Array2<f64>, tol: f64, what: &str) {
    assert_eq!(got.dim(), want.dim(), "{what}: shape");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for ((i, j), &w) in want.indexed_iter() {
        let g = f64::from(got[[i, j]]);
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: [{i}, {j}] = {g}, reference {w} (scale {scale})"
        );
    }
}

/// `grad` `(n, d)` against central finite differences (step 1e-6) of `f` at `x`: each
/// element within `tol` relative (absolute below 1), `what` naming the case.
pub(crate) fn assert_finite_differences(
    x: &Array2<f64>,
    f: impl Fn(&Array2<f64>) -> f64,
    grad: &Array2<f32>,
    tol: f64,
    what: &str,
) {
    let h = 1e-6;
    for ((i, j), &g) in grad.indexed_iter() {
        let (mut up, mut down) = (x.clone(), x.clone());
        up[[i, j]] += h;
        down[[i, j]] -= h;
        let fd = (f(&up) - f(&down)) / (2.0 * h);
        assert!(
            (f64::from(g) - fd).abs() < tol * fd.abs().max(1.0),
            "{what}: ∂/∂x[{i}, {j}] = {g}, finite difference {fd}"
        );
    }
}

/// Embeddings `(rows, d)` on the grid -2..=2 (ties at hinges and between distances are
/// common), no row all zero (its normalised gradient would be scaled by 1e12).
pub(crate) fn grid_embeddings(
    rows: usize,
    d: usize,
) -> impl proptest::strategy::Strategy<Value = Array2<f32>> {
    use proptest::strategy::Strategy;
    proptest::collection::vec(-2i8..=2, rows * d).prop_map(move |v| {
        let mut x = Array2::from_shape_vec((rows, d), v.into_iter().map(f32::from).collect())
            .expect("sized");
        for mut row in x.rows_mut() {
            if row.iter().all(|&v| v == 0.0) {
                row[0] = 1.0;
            }
        }
        x
    })
}

/// A triplet rule: every valid triplet, or `TripletMarginMiner` of any type with PML's margin,
/// 0 (ties at the boundary) or another small one.
pub(crate) fn triplet_rule(
) -> impl proptest::strategy::Strategy<Value = wgpu_metric_learning::TripletRule> {
    use proptest::prelude::*;
    use wgpu_metric_learning::{TripletRule, TripletType};
    prop_oneof![
        Just(TripletRule::AllValid),
        (
            0usize..4,
            prop_oneof![Just(0.2f32), Just(0.0), -0.1f32..0.6]
        )
            .prop_map(|(k, margin)| {
                let kind = [
                    TripletType::All,
                    TripletType::Hard,
                    TripletType::Semihard,
                    TripletType::Easy,
                ][k];
                TripletRule::Margin { kind, margin }
            }),
    ]
}

/// Each anchor's (positives, negatives) list.
pub(crate) type Lists = Vec<(Vec<u32>, Vec<u32>)>;

/// What a loss's reference reads for queries `x` `(b, d)` with `labels` against `refs`
/// (`None`: the queries, each row never its own positive): the reference rows, their
/// distances computed on `ctx`, and each anchor's lists.
pub(crate) fn reference_inputs(
    ctx: &Context,
    (x, labels): (&Array2<f32>, &Array1<u32>),
    refs: Option<&(Array1<u32>, Array2<f32>)>,
    distance: wgpu_metric_learning::DistanceConfig,
) -> (Array2<f32>, Array2<f32>, Lists) {
    use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
    use wgpu_metric_learning::{pairwise_distances, PairwiseConfig};
    let (ref_labels, ref_x) = refs.cloned().unwrap_or((labels.clone(), x.clone()));
    let slots: Vec<u32> = match refs {
        None => (0..labels.len() as u32).collect(),
        Some(_) => vec![u32::MAX; labels.len()],
    };
    let cfg = PairwiseConfig {
        distance,
        ..Default::default()
    };
    let distances = pairwise_distances(ctx, x, &ref_x, &cfg)
        .expect("distances")
        .values;
    let lists = triplet_lists(
        labels.as_slice().expect("contiguous"),
        ref_labels.as_slice().expect("contiguous"),
        &slots,
    );
    (ref_x, distances, lists)
}

/// A loss's gradients `got` (queries', references' when returned) against its reference's
/// `want` (through the anchors' role, through the references' role): without references
/// the queries' holds both roles and none is returned for references; with them the
/// references' comes exactly when `ref_grad_asked`. Tolerance 2e-4 of the largest element.
pub(crate) fn assert_loss_gradients(
    refs_given: bool,
    ref_grad_asked: bool,
    got: (&Array2<f32>, Option<&Array2<f32>>),
    want: (&Array2<f64>, &Array2<f64>),
    what: &str,
) {
    match (refs_given, got.1) {
        (false, None) => assert_close(got.0, &(want.0 + want.1), 2e-4, what),
        (true, g) => {
            assert_close(got.0, want.0, 2e-4, what);
            assert_eq!(g.is_some(), ref_grad_asked, "{what}: ref_grad when asked");
            if let Some(g) = g {
                assert_close(g, want.1, 2e-4, what);
            }
        }
        (false, Some(_)) => panic!("{what}: no references, no reference gradient"),
    }
}

//! Triplets mined straight into a device array (`mine_triplets_on_device`: the mining kernels,
//! then `triplet_expand` per window): the rows of `mine_triplets`, in its order, for every
//! rule, both counting methods, bank and device-buffer references, several anchor chunks and
//! output windows, no result; no triplet read back; the array counted in the budget; typed
//! errors.

use crate::common;

use ndarray::{s, Array1};
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use wgpu_metric_learning::{
    mine_triplets, mine_triplets_on_device, Context, CountMethod, DeviceEmbeddings, Error, Hooks,
    MiningSet, Progress, TripletConfig, TripletRule, TripletType,
};

use common::grid_data as data;

const RULES: [Option<TripletType>; 5] = [
    None,
    Some(TripletType::All),
    Some(TripletType::Hard),
    Some(TripletType::Semihard),
    Some(TripletType::Easy),
];

fn config(rule: Option<TripletType>, method: CountMethod, window: usize) -> TripletConfig {
    let mut cfg = match rule {
        None => TripletConfig::default(),
        Some(kind) => TripletConfig::margin_miner(kind),
    };
    cfg.count_method = method;
    cfg.max_chunk_triplets = window;
    cfg
}

/// The device rows equal `mine_triplets`' on `ctx`, and none of them came back to the host.
fn check(
    ctx: &Context,
    queries: &MiningSet<'_, u32>,
    refs: Option<&MiningSet<'_, u32>>,
    cfg: &TripletConfig,
) -> usize {
    let on_device = mine_triplets_on_device(ctx, queries, refs, cfg).expect("on device");
    let quiet = TripletConfig {
        hooks: Hooks::new(),
        ..cfg.clone()
    };
    let host = mine_triplets(ctx, queries, refs, &quiet).expect("host");
    let got = on_device.triplets.to_host(ctx).expect("read");
    assert_eq!(got, host.indices, "{:?}", cfg.rule);
    let t = on_device.len() as u64;
    // Counts and list sizes come back (4 bytes per pair, 8 per anchor; twice for a margin
    // rule: counted, then written); the rows do not.
    let b = queries.len() as u64;
    let m = refs.map_or(b, |r| r.len() as u64);
    assert!(
        on_device.transfers.bytes_down <= 2 * (4 * b * m + 8 * b),
        "{:?} for {t} triplets",
        on_device.transfers
    );
    on_device.len()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(common::cases(10)))]
    #[test]
    fn equals_mine_triplets(
        b in 1usize..60,
        m in 1usize..90,
        classes in 1usize..6,
        rule in 0usize..5,
        sorted: bool,
        window in 1usize..400,
        seed: u64,
    ) {
        let Some(ctx) = common::shared_gpu() else { return Ok(()) };
        let (q, qy) = data(b, 6, classes, seed);
        let (r, ry) = data(m, 6, classes, seed ^ 7);
        let method = if sorted { CountMethod::Sorted } else { CountMethod::Scan };
        let cfg = config(RULES[rule], method, window);
        let (queries, refs) = (MiningSet::new(&q, &qy), MiningSet::new(&r, &ry));
        check(ctx, &queries, Some(&refs), &cfg);
        check(ctx, &queries, None, &cfg);
    }
}

#[test]
fn several_chunks_and_windows_under_a_tight_budget() {
    let Some(shared) = common::shared_gpu() else {
        return;
    };
    let (x, y) = data(300, 16, 150, 11);
    let set = MiningSet::new(&x, &y);
    for rule in RULES {
        // A budget of the array and 320 KiB: the chunks get what the array leaves.
        let t = mine_triplets(shared, &set, None, &config(rule, CountMethod::Auto, 1000))
            .expect("host")
            .indices
            .nrows() as u64;
        let Some(ctx) = common::gpu_context(Some(12 * t + (320 << 10))) else {
            return;
        };
        let mut cfg = config(rule, CountMethod::Auto, 1000);
        // Progress comes once per anchor chunk; a margin rule's writing pass reports past the
        // `b · m` pairs of its counting pass.
        let reports = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&reports);
        cfg.hooks = Hooks::new().on_progress(move |p: Progress| {
            seen.lock().expect("lock").push(p.done);
        });
        ctx.reset_peak();
        let mined = mine_triplets_on_device(&ctx, &set, None, &cfg).expect("on device");
        let first = if rule.is_none() { 0 } else { 300 * 300 };
        let done = reports.lock().expect("lock").clone();
        let writing = done.iter().filter(|&&d| d > first).count();
        assert!(writing > 1, "several anchor chunks ({rule:?}): {done:?}");
        let memory = ctx.memory();
        assert!(memory.peak_bytes <= memory.budget_bytes, "{memory:?}");
        assert_eq!(mined.len() as u64, t);
        assert!(t > 1000, "several windows: {t} triplets ({rule:?})");
        // One wait per anchor chunk for its list sizes (every valid triplet) or two for its
        // counts (a margin rule: counted, then written), and one at the end.
        let host = mine_triplets(shared, &set, None, &cfg).expect("host");
        assert_eq!(mined.triplets.to_host(&ctx).expect("read"), host.indices);
    }
}

#[test]
fn bank_and_device_buffer_references() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let (x, y) = data(300, 12, 4, 12);
    let (q, qy) = (
        x.slice(s![..50, ..]).to_owned(),
        y.slice(s![..50]).to_owned(),
    );
    let bank = common::wrapped_bank(ctx, &x, &y);
    let queries = MiningSet::new(&q, &qy);
    let cfg = config(Some(TripletType::Semihard), CountMethod::Auto, 1 << 22);
    let from_bank = mine_triplets_on_device(ctx, &queries, Some(&bank.refs()), &cfg);
    let host = mine_triplets(ctx, &queries, Some(&bank.refs()), &cfg).expect("host");
    assert_eq!(
        from_bank
            .expect("bank")
            .triplets
            .to_host(ctx)
            .expect("read"),
        host.indices
    );

    let buffer = common::upload(ctx, &x, 0, 12);
    let rows = DeviceEmbeddings::new(&buffer, 0, (300, 12));
    let refs = MiningSet::new(rows, &y);
    let got = mine_triplets_on_device(ctx, &queries, Some(&refs), &cfg).expect("device refs");
    let want = mine_triplets(ctx, &queries, Some(&MiningSet::new(&x, &y)), &cfg).expect("host");
    assert_eq!(got.triplets.to_host(ctx).expect("read"), want.indices);
}

#[test]
fn the_array_counts_in_the_budget_and_no_triplet_is_an_empty_array() {
    let Some(ctx) = common::gpu_context_as_shipped(Some(64 << 20)) else {
        return;
    };
    let (x, y) = data(100, 8, 3, 13);
    let set = MiningSet::new(&x, &y);
    let before = ctx.memory().current_bytes;
    let mined =
        mine_triplets_on_device(&ctx, &set, None, &TripletConfig::default()).expect("mined");
    assert!(!mined.is_empty());
    assert_eq!(mined.triplets.bytes(), 12 * mined.len() as u64);
    assert_eq!(
        ctx.memory().current_bytes - before,
        mined.triplets.bytes().next_multiple_of(4),
        "only the array is held"
    );
    drop(mined);
    assert_eq!(ctx.memory().current_bytes, before);

    // One class: no negative, no triplet.
    let one = Array1::<u32>::zeros(100);
    let none = mine_triplets_on_device(
        &ctx,
        &MiningSet::new(&x, &one),
        None,
        &TripletConfig::default(),
    )
    .expect("none");
    assert!(none.is_empty());
    assert_eq!(none.triplets.to_host(&ctx).expect("read").dim(), (0, 3));
}

#[test]
fn bad_calls_are_typed_errors() {
    let (x, y) = data(10, 4, 2, 14);
    let set = MiningSet::new(&x, &y);
    let got = mine_triplets_on_device(
        &Context::native_cpu(None),
        &set,
        None,
        &TripletConfig::default(),
    );
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "ctx", .. })),
        "{got:?}"
    );
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let mut cfg = config(Some(TripletType::Hard), CountMethod::Auto, 1 << 22);
    cfg.rule = TripletRule::Margin {
        kind: TripletType::Hard,
        margin: f32::NAN,
    };
    let got = mine_triplets_on_device(ctx, &set, None, &cfg);
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "margin", .. })),
        "{got:?}"
    );
    let labels_only = MiningSet::<u32>::from_labels(&y);
    let got = mine_triplets_on_device(
        ctx,
        &labels_only,
        None,
        &config(Some(TripletType::Hard), CountMethod::Auto, 1 << 22),
    );
    assert!(
        matches!(got, Err(Error::InvalidParameter { .. })),
        "{got:?}"
    );
}

#[test]
fn a_result_that_does_not_fit_beside_one_chunk_is_counted_then_mined_in_what_it_leaves() {
    // The anchors fit one chunk, whose output windows take most of the budget: the array of
    // the kept triplets is sized after that chunk is freed.
    let Some(shared) = common::shared_gpu() else {
        return;
    };
    let (q, qy) = data(64, 16, 20, 15);
    let (r, ry) = data(3000, 16, 20, 16);
    let (queries, refs) = (MiningSet::new(&q, &qy), MiningSet::new(&r, &ry));
    let cfg = config(Some(TripletType::All), CountMethod::Auto, 1 << 22);
    let host = mine_triplets(shared, &queries, Some(&refs), &cfg).expect("host");
    let t = host.indices.nrows() as u64;
    let Some(ctx) = common::gpu_context(Some(12 * t + (24 << 20))) else {
        return;
    };
    ctx.reset_peak();
    let mined = mine_triplets_on_device(&ctx, &queries, Some(&refs), &cfg).expect("on device");
    let memory = ctx.memory();
    assert!(memory.peak_bytes <= memory.budget_bytes, "{memory:?}");
    assert_eq!(mined.triplets.to_host(&ctx).expect("read"), host.indices);
}

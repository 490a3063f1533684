//! Embeddings already on the device (`DeviceEmbeddings`): every operation gives with them what
//! it gives with the same rows from the host, none of their bytes cross to the host, bad
//! buffers are typed errors, and plans count the import.

use crate::common;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy, all_pairs, batch_easy_hard_pairs, batch_hard_triplets, count_triplets, knn, knn_plan,
    mine_triplets, multi_similarity_pairs, pair_margin_pairs, pairwise_distances, AccuracyConfig,
    AllPairsConfig, BankConfig, BatchEasyHardConfig, BatchHardConfig, Context, DeviceEmbeddings,
    Embeddings, Error, KnnConfig, MemoryBank, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    SelfExclusion, TripletConfig, TripletType,
};

/// Rows in a few classes, on a grid of sixteenths (exact in f32, frequent ties).
fn data(n: usize, d: usize, seed: usize) -> (Array2<f32>, Array1<i64>) {
    let x = Array2::from_shape_fn((n, d), |(i, k)| {
        (((seed * 7 + i * 13 + k * 5) % 23) as f32 - 11.0) / 16.0
    });
    let y = Array1::from_shape_fn(n, |i| ((i * 7 + seed) % 4) as i64);
    (x, y)
}

/// Every operation, with host and with device queries and references, on `ctx`.
#[test]
fn every_operation_gives_with_device_rows_what_it_gives_with_host_rows() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    // Dims on and off the vec4; dense and strided rows, at an offset.
    for (d, offset, extra) in [(8, 0, 0), (5, 12, 3), (16, 256, 4)] {
        let (q, qy) = data(37, d, 1);
        let (r, ry) = data(53, d, 2);
        let (qb, rb) = (
            common::upload(ctx, &q, offset, d + extra),
            common::upload(ctx, &r, offset, d + extra),
        );
        let qd = DeviceEmbeddings::new(&qb, offset, (37, d)).with_row_stride(d + extra);
        let rd = DeviceEmbeddings::new(&rb, offset, (53, d)).with_row_stride(d + extra);
        let case = format!("d {d}, offset {offset}, stride {}", d + extra);

        let host = pairwise_distances(ctx, &q, &r, &Default::default()).expect("host");
        for (qe, re) in [
            (Embeddings::from(qd), Embeddings::from(rd)),
            (Embeddings::from(&q), Embeddings::from(rd)),
            (Embeddings::from(qd), Embeddings::from(&r)),
        ] {
            let dev = pairwise_distances(ctx, qe, re, &Default::default()).expect("device");
            assert_eq!(dev.values, host.values, "{case}");
        }

        let cfg = KnnConfig {
            k: 7,
            ..Default::default()
        };
        let host = knn(ctx, &q, &r, &cfg).expect("host");
        let dev = knn(ctx, qd, rd, &cfg).expect("device");
        assert_eq!(
            (&dev.indices, &dev.scores),
            (&host.indices, &host.scores),
            "{case}"
        );
        let (hq, hr) = (MiningSet::new(&q, &qy), MiningSet::new(&r, &ry));
        let (dq, dr) = (MiningSet::new(qd, &qy), MiningSet::new(rd, &ry));
        let acc = AccuracyConfig::default();
        let want = accuracy(ctx, &hq, Some(&hr), &acc).expect("host");
        let got = accuracy(ctx, &dq, Some(&dr), &acc).expect("device");
        assert_eq!(got.metrics, want.metrics, "{case}");

        for kind in [TripletType::All, TripletType::Hard, TripletType::Semihard] {
            let cfg = TripletConfig::margin_miner(kind);
            for (a, b) in [(Some(&hr), Some(&dr)), (None, None)] {
                let want = mine_triplets(ctx, &hq, a, &cfg).expect("host");
                let got = mine_triplets(ctx, &dq, b, &cfg).expect("device");
                assert_eq!(got.indices, want.indices, "{case}, {kind:?}");
                let count = count_triplets(ctx, &dq, b, &cfg).expect("count");
                assert_eq!(count.count, want.len() as u64, "{case}, {kind:?}");
            }
        }
        let pm = PairMarginConfig::default();
        let (want, got) = (
            pair_margin_pairs(ctx, &hq, Some(&hr), &pm).expect("host"),
            pair_margin_pairs(ctx, &dq, Some(&dr), &pm).expect("device"),
        );
        assert_eq!(
            (got.positives, got.negatives),
            (want.positives, want.negatives)
        );
        let ms = MultiSimilarityConfig::default();
        let (want, got) = (
            multi_similarity_pairs(ctx, &hq, None, &ms).expect("host"),
            multi_similarity_pairs(ctx, &dq, None, &ms).expect("device"),
        );
        assert_eq!(
            (got.positives, got.negatives),
            (want.positives, want.negatives)
        );
        let eh = BatchEasyHardConfig::default();
        let (want, got) = (
            batch_easy_hard_pairs(ctx, &hq, Some(&hr), &eh).expect("host"),
            batch_easy_hard_pairs(ctx, &dq, Some(&dr), &eh).expect("device"),
        );
        assert_eq!(
            (got.positives, got.negatives),
            (want.positives, want.negatives)
        );
        let bh = BatchHardConfig::default();
        let (want, got) = (
            batch_hard_triplets(ctx, &hq, Some(&hr), &bh).expect("host"),
            batch_hard_triplets(ctx, &dq, Some(&dr), &bh).expect("device"),
        );
        assert_eq!(got.indices, want.indices, "{case}");
        // Label-only miners never look at the rows.
        let all = all_pairs(ctx, &dq, None, &AllPairsConfig::default()).expect("all pairs");
        assert_eq!(all.transfers.host_waits, 0);
    }
}

#[test]
fn device_rows_never_cross_to_the_host() {
    // As shipped: no sentinel fills among the uploads.
    let Some(ctx) = common::gpu_context_as_shipped(None) else {
        return;
    };
    let (n, d) = (300, 32);
    let (x, y) = data(n, d, 8);
    let buffer = common::upload(&ctx, &x, 0, d);
    let rows = DeviceEmbeddings::new(&buffer, 0, (n, d));
    let bytes = (4 * n * d) as u64;
    let cfg = KnnConfig {
        k: 5,
        ..Default::default()
    };
    let dev = knn(&ctx, rows, rows, &cfg).expect("device").transfers;
    let host = knn(&ctx, &x, &x, &cfg).expect("host").transfers;
    // Up: parameters only. Down: the neighbours, and 4 bytes per row of the import's norms:
    // the same rows on both sides are imported once.
    assert!(dev.bytes_up < bytes / 10, "{dev:?}");
    assert!(host.bytes_up >= 2 * bytes, "{host:?}");
    assert_eq!(
        dev.bytes_down,
        host.bytes_down + 4 * n as u64,
        "{dev:?} vs {host:?}"
    );
    assert_eq!(
        dev.host_waits,
        host.host_waits + 1,
        "one wait for the one import"
    );
    // Other rows on the other side: two imports.
    let copy = common::upload(&ctx, &x, 0, d);
    let other = DeviceEmbeddings::new(&copy, 0, (n, d));
    let two = knn(&ctx, rows, other, &cfg).expect("device").transfers;
    assert_eq!(
        two.bytes_down,
        host.bytes_down + 2 * 4 * n as u64,
        "{two:?} vs {host:?}"
    );
    assert_eq!(two.host_waits, host.host_waits + 2, "one wait per import");
    // Mining uploads what the host derives from labels, the same with either rows.
    let semihard = TripletConfig::margin_miner(TripletType::Semihard);
    let dev = mine_triplets(&ctx, &MiningSet::new(rows, &y), None, &semihard).expect("mine");
    let host = mine_triplets(&ctx, &MiningSet::new(&x, &y), None, &semihard).expect("mine");
    assert_eq!(dev.indices, host.indices);
    let (dev, host) = (dev.transfers, host.transfers);
    assert!(dev.bytes_up + bytes <= host.bytes_up, "{dev:?} vs {host:?}");
    let d = pairwise_distances(&ctx, rows, rows, &Default::default()).expect("distances");
    assert!(d.transfers.bytes_up < bytes / 10, "{:?}", d.transfers);
}

#[test]
fn a_bank_takes_device_rows_whole_masked_and_strided() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let d = 6;
    let (x, y) = data(9, d, 3);
    let buffer = common::upload(ctx, &x, 8, d + 2);
    let rows = DeviceEmbeddings::new(&buffer, 8, (9, d)).with_row_stride(d + 2);
    let cfg = BankConfig {
        page_rows: Some(4),
        ..BankConfig::new(13, d)
    };
    let mut from_device = MemoryBank::<i64>::new(ctx, &cfg).expect("bank");
    let mut from_host = MemoryBank::<i64>::new(ctx, &cfg).expect("bank");
    let mask = Array1::from_shape_fn(9, |i| i % 3 != 1);
    for step in 0..3 {
        let (a, b) = if step == 1 {
            (
                from_device.enqueue_masked(ctx, &MiningSet::new(rows, &y), mask.view()),
                from_host.enqueue_masked(ctx, &MiningSet::new(&x, &y), mask.view()),
            )
        } else {
            (
                from_device.enqueue(ctx, &MiningSet::new(rows, &y)),
                from_host.enqueue(ctx, &MiningSet::new(&x, &y)),
            )
        };
        let (a, b) = (a.expect("device"), b.expect("host"));
        assert_eq!(
            (a.slots, a.query_rows),
            (b.slots, b.query_rows),
            "step {step}"
        );
        assert!(a.transfers.bytes_up < 4 * 9 * d as u64, "{:?}", a.transfers);
    }
    assert_eq!(
        from_device.snapshot(ctx).expect("snapshot"),
        from_host.snapshot(ctx).expect("snapshot")
    );
    // The bank's rows as queries against device references.
    let enq = SelfExclusion::None;
    let cfg = TripletConfig {
        self_exclusion: enq,
        ..TripletConfig::margin_miner(TripletType::Semihard)
    };
    let want = mine_triplets(ctx, &from_host.refs(), Some(&MiningSet::new(&x, &y)), &cfg);
    let got = mine_triplets(
        ctx,
        &from_device.refs(),
        Some(&MiningSet::new(rows, &y)),
        &cfg,
    );
    assert_eq!(got.expect("device").indices, want.expect("host").indices);
}

#[test]
fn bad_device_rows_are_typed_errors_before_any_work() {
    let Some(ctx) = common::shared_gpu() else {
        return;
    };
    let cfg = KnnConfig {
        k: 1,
        ..Default::default()
    };
    let (x, _) = data(6, 5, 4);
    let host = ndarray::Array2::<f32>::zeros((2, 5));
    let good = common::upload(ctx, &x, 0, 5);
    let invalid = |got: Result<_, Error>, what: &str, needle: &str| match got {
        Err(Error::InvalidParameter { what: w, rule, .. }) => {
            assert_eq!(w, what);
            assert!(rule.contains(needle), "{rule}");
        }
        other => panic!("{needle}: {other:?}"),
    };
    let dev =
        |offset, shape, stride| DeviceEmbeddings::new(&good, offset, shape).with_row_stride(stride);
    invalid(
        knn(ctx, &host, dev(2, (2, 5), 5), &cfg).map(|_| ()),
        "refs",
        "multiple of 4",
    );
    invalid(
        knn(ctx, dev(0, (2, 5), 4), &host, &cfg).map(|_| ()),
        "queries",
        "row stride",
    );
    invalid(
        knn(ctx, &host, dev(4, (6, 5), 5), &cfg).map(|_| ()),
        "refs",
        "inside the buffer",
    );
    let shape = knn(ctx, &host, dev(0, (2, 0), 0), &cfg);
    assert!(matches!(shape, Err(Error::Shape { .. })), "{shape:?}");
    let (device, _) = ctx.wgpu_device().expect("a wgpu context");
    let no_copy = device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let rows = DeviceEmbeddings::new(&no_copy, 0, (2, 5));
    invalid(knn(ctx, &host, rows, &cfg).map(|_| ()), "refs", "COPY_SRC");
    // A native context has no device for the buffer.
    let native = Context::native_cpu(None);
    invalid(
        knn(&native, &host, dev(0, (2, 5), 5), &cfg).map(|_| ()),
        "refs",
        "wgpu context",
    );
    // Non-finite values are found on the device and named; nothing is left allocated.
    // On a context of its own, whose memory no other test moves.
    let Some(own) = common::gpu_context(None) else {
        return;
    };
    let ctx = &own;
    let mut bad = x.clone();
    bad[[4, 3]] = f32::INFINITY;
    let buffer = common::upload(ctx, &bad, 0, 7);
    let rows = DeviceEmbeddings::new(&buffer, 0, (6, 5)).with_row_stride(7);
    let before = ctx.memory().current_bytes;
    let got = knn(ctx, rows, &host, &cfg);
    assert!(
        matches!(
            got,
            Err(Error::NonFinite {
                what: "queries",
                row: 4,
                col: 3,
                ..
            })
        ),
        "{got:?}"
    );
    assert_eq!(ctx.memory().current_bytes, before);

    // Rules that need no device are checked before the rows are imported: no wait at all.
    let own_buffer = common::upload(ctx, &x, 0, 5);
    let rows = DeviceEmbeddings::new(&own_buffer, 0, (6, 5));
    let waits = ctx.transfers().host_waits;
    let bad_k = KnnConfig {
        k: 0,
        ..Default::default()
    };
    assert!(matches!(
        knn(ctx, rows, rows, &bad_k),
        Err(Error::InvalidParameter { what: "k", .. })
    ));
    let y = Array1::from_elem(6, 0i64);
    let fixed = AccuracyConfig {
        k: wgpu_metric_learning::AccuracyK::Fixed(0),
        ..Default::default()
    };
    let got = accuracy(ctx, &MiningSet::new(rows, &y), None, &fixed);
    assert!(
        matches!(got, Err(Error::InvalidParameter { what: "k", .. })),
        "{got:?}"
    );
    assert_eq!(ctx.transfers().host_waits, waits, "nothing was imported");
    // A native bank takes host rows only, whatever the context.
    let mut bank =
        MemoryBank::<i64>::new(&Context::native_cpu(None), &BankConfig::new(8, 5)).expect("bank");
    let got = bank.enqueue(ctx, &MiningSet::new(rows, &y));
    assert!(
        matches!(
            got,
            Err(Error::InvalidParameter {
                what: "embeddings",
                ..
            })
        ),
        "{got:?}"
    );
    assert!(bank.is_empty());
}

#[test]
fn a_buffer_of_another_device_is_a_typed_error() {
    let (Some(ctx), Some(other)) = (common::shared_gpu(), common::gpu_context(None)) else {
        return;
    };
    if ctx.adapter_info().map(|i| i.backend) == Some(wgpu::Backend::Gl) {
        // Documented: GL contexts have instances of their own, whose ids wgpu cannot tell apart.
        eprintln!("not checked on GL: a buffer of another GL context is not detected");
        return;
    }
    let (x, _) = data(4, 8, 5);
    let foreign = common::upload(&other, &x, 0, 8);
    let rows = DeviceEmbeddings::new(&foreign, 0, (4, 8));
    let got = pairwise_distances(ctx, rows, &x, &Default::default());
    assert!(
        matches!(
            got,
            Err(Error::InvalidParameter {
                what: "queries",
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn plans_count_the_import_and_calls_stay_within_them() {
    let Some(ctx) = common::gpu_context(Some(8 << 20)) else {
        return;
    };
    let (q, _) = data(300, 40, 6);
    let (r, _) = data(2000, 40, 7);
    let (qb, rb) = (
        common::upload(&ctx, &q, 0, 40),
        common::upload(&ctx, &r, 0, 40),
    );
    let (qd, rd) = (
        DeviceEmbeddings::new(&qb, 0, (300, 40)),
        DeviceEmbeddings::new(&rb, 0, (2000, 40)),
    );
    let cfg = KnnConfig {
        k: 10,
        ..Default::default()
    };
    let host_plan = knn_plan(&ctx, &q, &r, &cfg).expect("host plan");
    let plan = knn_plan(&ctx, qd, rd, &cfg).expect("device plan");
    // The import holds both sides' rows, padded to vec4s, with their norms.
    assert!(
        plan.min_bytes >= 4 * (300 + 2000) * 41,
        "{plan:?} vs {host_plan:?}"
    );
    ctx.reset_peak();
    let found = knn(&ctx, qd, rd, &cfg).expect("search");
    let peak = ctx.memory().peak_bytes;
    assert!(peak <= plan.bytes, "peak {peak} > planned {}", plan.bytes);
    assert!(peak <= 8 << 20);
    assert_eq!(
        found.indices,
        knn(&ctx, &q, &r, &cfg).expect("host").indices
    );
    // Under a budget that the rows alone exceed, plan and call fail alike.
    let tight = common::gpu_context(Some(plan.min_bytes / 2)).expect("context");
    let (qt, rt) = (
        common::upload(&tight, &q, 0, 40),
        common::upload(&tight, &r, 0, 40),
    );
    let (qd, rd) = (
        DeviceEmbeddings::new(&qt, 0, (300, 40)),
        DeviceEmbeddings::new(&rt, 0, (2000, 40)),
    );
    assert!(knn_plan(&tight, qd, rd, &cfg).is_err());
    assert!(knn(&tight, qd, rd, &cfg).is_err());
    assert_eq!(tight.memory().current_bytes, 0);
}

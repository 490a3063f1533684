//! burn tensors read in place by the library on a shared wgpu device: the rows it sees are the
//! tensor's (dense, column-sliced, transposed), and a CPU tensor is a typed error; triplets and
//! neighbours the library left on the device become burn index tensors equal to the host's.

use burn::tensor::{Device, Distribution, Int, Tensor};
use ndarray::{Array1, ArrayView2};
use wgpu_metric_learning::{
    knn, knn_on_device, mine_triplets, mine_triplets_on_device, pairwise_distances, ContextConfig,
    KnnConfig, MiningSet, PairwiseConfig, TripletConfig, TripletType,
};
use wgpu_metric_learning_burn::{
    index_columns_on_device, shared_wgpu, to_array, DeviceTensor, Error,
};

#[test]
fn the_library_reads_burn_tensors_in_place() {
    // burn sets its wgpu device up once per process: one test does everything.
    let shared = match shared_wgpu(&ContextConfig::default()) {
        Ok(s) => s,
        Err(e) if std::env::var("WML_REQUIRE_GPU").is_ok_and(|v| v == "1") => {
            panic!("WML_REQUIRE_GPU=1 but burn found no wgpu device: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu device ({e})");
            return;
        }
    };
    let (device, ctx) = (&shared.device, &shared.ctx);
    let x = Tensor::<2>::random([37, 5], Distribution::Default, device);
    let r = Tensor::<2>::random([20, 8], Distribution::Default, device) * 2.0;
    // Dense rows, a column slice (rows 8 floats apart), and a transposed view.
    let cases = [
        ("dense", x.clone()),
        ("column slice", r.clone().slice([0..20, 0..5])),
        (
            "transposed",
            Tensor::<2>::random([5, 11], Distribution::Default, device).transpose(),
        ),
    ];
    let cfg = PairwiseConfig::default();
    for (name, t) in cases {
        let host = to_array(&t).expect("read back");
        let want = pairwise_distances(ctx, &host, &host, &cfg).expect("host rows");
        match DeviceTensor::of(&t) {
            Ok(rows) => {
                let got = pairwise_distances(ctx, rows.embeddings(), rows.embeddings(), &cfg)
                    .expect("device rows");
                assert_eq!(got.values, want.values, "{name}");
                // The rows never crossed to the host: only parameters went up.
                let bytes = 4 * host.len() as u64;
                assert!(
                    got.transfers.bytes_up < bytes,
                    "{name}: {:?}",
                    got.transfers
                );
            }
            // Rows that are not contiguous floats are refused, never misread.
            Err(Error::Layout { .. }) if name == "transposed" => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
    let cpu = Tensor::<2>::zeros([2, 2], &Device::flex());
    assert!(matches!(DeviceTensor::of(&cpu), Err(Error::NotWgpu(_))));

    // Triplets and neighbours the library left on the device, as burn index tensors.
    let labels = Array1::from_shape_fn(37, |i| (i % 3) as i64);
    let rows = DeviceTensor::of(&x).expect("rows");
    let batch = MiningSet::new(rows.embeddings(), &labels);
    // A training step's index tensors live on the autodiff device.
    let autodiff = device.clone().autodiff();
    for (cfg, on) in [
        (TripletConfig::default(), device),
        (
            TripletConfig::margin_miner(TripletType::Semihard),
            &autodiff,
        ),
    ] {
        let mined = mine_triplets_on_device(ctx, &batch, None, &cfg).expect("on device");
        let host = mine_triplets(ctx, &batch, None, &cfg).expect("host");
        assert!(!mined.is_empty(), "{:?}", cfg.rule);
        let columns = index_columns_on_device::<3>(ctx, &mined.triplets, on).expect("columns");
        same_columns(columns, host.indices.view(), &format!("{:?}", cfg.rule));
    }
    let cfg = KnnConfig {
        k: 5,
        ..Default::default()
    };
    let found = knn_on_device(ctx, rows.embeddings(), rows.embeddings(), &cfg).expect("knn");
    let host = knn(ctx, rows.embeddings(), rows.embeddings(), &cfg).expect("knn");
    let columns = index_columns_on_device::<5>(ctx, &found.indices, device).expect("columns");
    same_columns(columns, host.indices.view(), "neighbours");
    assert!(matches!(
        index_columns_on_device::<3>(ctx, &found.indices, device),
        Err(Error::Layout { .. })
    ));
}

/// Each burn index tensor equals its column of `want`.
fn same_columns<const C: usize>(
    columns: [Tensor<1, Int>; C],
    want: ArrayView2<'_, u32>,
    case: &str,
) {
    for (c, column) in columns.into_iter().enumerate() {
        let got = column.try_to_vec_as::<i64>().expect("read");
        let want: Vec<i64> = want.column(c).iter().map(|&i| i64::from(i)).collect();
        assert_eq!(got, want, "column {c} of {case}");
    }
}

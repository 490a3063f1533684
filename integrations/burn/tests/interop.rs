//! burn tensors read in place by the library on a shared wgpu device: the rows it sees are the
//! tensor's (dense, column-sliced, transposed), and a CPU tensor is a typed error.

use burn::tensor::{Device, Distribution, Tensor};
use wgpu_metric_learning::{pairwise_distances, ContextConfig, PairwiseConfig};
use wgpu_metric_learning_burn::{shared_wgpu, to_array, DeviceTensor, Error};

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
}

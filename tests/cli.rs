//! The `wml` command line on small `.npy` files: each subcommand against the library call it
//! wraps, the dtypes it accepts, `--stats`, and bad input (one line, non-zero exit, no panic).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ndarray::{array, Array1, Array2};
use ndarray_npy::{read_npy, write_npy};
use wgpu_metric_learning::DynamicSoftMargin;
use wgpu_metric_learning::{
    accuracy, angular_triplets, batch_hard_triplets, distance_weighted_triplets, hdc_pairs, knn,
    mine_triplets, multiple_negatives_ranking_loss, ntxent_loss, pair_loss, pair_margin_pairs,
    triplet_margin_loss, uniform_histogram_pairs, vicreg_loss, AccuracyConfig, AccuracyK,
    AccuracyMetric, Angular, AngularConfig, BatchHardConfig, Circle, Context, Contrastive,
    Distance, DistanceConfig, DistanceWeightedConfig, FastAp, GeneralizedLifted, HdcConfig,
    InfoNceConfig, Instance, IntraPairVariance, KmeansConfig, KnnConfig, LiftedStructure, Margin,
    Matryoshka, MiningSet, MnrlConfig, MultiSimilarity, NPairs, Nca, PairLoss, PairLossConfig,
    PairLossRule, PairMarginConfig, Pnp, PnpVariant, RankedList, SelfExclusion, SnrContrastive,
    SupCon, ThresholdConsistentMargin, TripletConfig, TripletLossConfig, TripletRule, TripletType,
    TupletMargin, UniformHistogramConfig, VicRegConfig,
};

/// A fresh directory for one test's files.
pub(crate) fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wml-cli-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

pub(crate) fn wml(args: &[&str]) -> Output {
    // Mesa's Vulkan loader warns on stderr when XDG_RUNTIME_DIR is unset (CI containers);
    // a desktop session sets it. Set here so stderr holds only what wml prints.
    Command::new(env!("CARGO_BIN_EXE_wml"))
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run wml")
}

pub(crate) fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// The run succeeded; its stdout.
pub(crate) fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "wml failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run failed with status 1 and a one-line message containing every one of `needles`.
pub(crate) fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "exit status for: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "{err:?} should mention {n:?}");
    }
}

/// 12 points in 3 classes of 4 (int64 labels), in 5-d.
fn clustered() -> (Array2<f32>, Array1<i64>) {
    let x = Array2::from_shape_fn((12, 5), |(i, j)| {
        let c = (i % 3) as f32;
        // Sixteenths: every squared distance is exact in f32, so the kNN test's ties (queries 3
        // and 4 have two neighbours at one distance) go to the lower index on every device.
        let jitter = ((i * 7 + j * 3) % 11) as f32 / 16.0;
        if j == i % 3 {
            2.0 + c + jitter
        } else {
            jitter
        }
    });
    let y = Array1::from_shape_fn(12, |i| (i % 3) as i64);
    (x, y)
}

pub(crate) fn json_field(json: &str, key: &str) -> f64 {
    let at = json.find(&format!("\"{key}\": ")).expect(key) + key.len() + 4;
    let rest = &json[at..];
    let end = rest.find([',', '}']).expect("end of value");
    rest[..end].trim().parse().expect("number")
}

#[test]
fn help_lists_the_subcommands() {
    let out = ok(&wml(&["--help"]));
    for sub in ["triplets", "mine", "knn", "accuracy", "loss"] {
        assert!(out.contains(sub), "--help lists {sub}: {out}");
    }
    assert!(ok(&wml(&["knn", "--help"])).contains("--out-indices"));
}

#[test]
fn triplets_from_labels_of_every_accepted_dtype_match_the_library() {
    let d = dir("triplets-labels");
    let labels = array![0i64, 0, 1, 1, 2, 0];
    let ctx = Context::native_cpu(None);
    let want = mine_triplets(
        &ctx,
        &MiningSet::from_labels(&labels),
        None,
        &TripletConfig::default(),
    )
    .expect("library");
    let (l64, l32, lu32) = (d.join("l64.npy"), d.join("l32.npy"), d.join("lu32.npy"));
    write_npy(&l64, &labels).expect("write");
    write_npy(&l32, &labels.mapv(|v| v as i32)).expect("write");
    write_npy(&lu32, &labels.mapv(|v| v as u32)).expect("write");
    for labels in [&l64, &l32, &lu32] {
        let out = d.join("t.npy");
        ok(&wml(&[
            "triplets",
            "--labels",
            arg(labels),
            "--out",
            arg(&out),
        ]));
        let got: Array2<i64> = read_npy(&out).expect("read output");
        assert_eq!(got, want.indices.mapv(i64::from), "{}", labels.display());
    }
    let count = ok(&wml(&["triplets", "--labels", arg(&l64), "--count-only"]));
    assert_eq!(count.trim(), format!("{{\"count\": {}}}", want.len()));
}

#[test]
fn triplet_margin_miner_with_refs_matches_the_library() {
    let d = dir("triplets-margin");
    let (x, y) = clustered();
    let (rx, ry) = (x.slice(ndarray::s![..8, ..]), y.slice(ndarray::s![..8]));
    let cfg = TripletConfig {
        rule: TripletRule::Margin {
            kind: TripletType::Easy,
            margin: 0.5,
        },
        distance: DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        ..Default::default()
    };
    let want = mine_triplets(
        &Context::native_cpu(None),
        &MiningSet::new(&x, &y),
        Some(&MiningSet::new(rx, ry)),
        &cfg,
    )
    .expect("library");
    let files = ["x", "y", "rx", "ry", "t"].map(|f| d.join(format!("{f}.npy")));
    write_npy(&files[0], &x).expect("write");
    write_npy(&files[1], &y).expect("write");
    write_npy(&files[2], &rx.to_owned()).expect("write");
    write_npy(&files[3], &ry.to_owned()).expect("write");
    #[rustfmt::skip]
    let args = [
        "triplets", "--labels", arg(&files[1]), "--embeddings", arg(&files[0]),
        "--ref-labels", arg(&files[3]), "--ref-embeddings", arg(&files[2]),
        "--type", "easy", "--margin", "0.5", "--distance", "cosine", "--out", arg(&files[4]),
    ];
    ok(&wml(&args));
    let got: Array2<i64> = read_npy(&files[4]).expect("read output");
    assert!(!want.is_empty(), "the case has easy triplets");
    assert_eq!(got, want.indices.mapv(i64::from));
}

#[test]
fn knn_on_both_paths_matches_the_library_and_reports_stats() {
    let d = dir("knn");
    let (x, _) = clustered();
    let q = d.join("q.npy");
    // float64, numpy's default, is accepted and converted.
    write_npy(&q, &x.mapv(f64::from)).expect("write");
    let cfg = KnnConfig {
        k: 3,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        self_exclusion: SelfExclusion::SameIndex,
        ..Default::default()
    };
    let want = knn(&Context::native_cpu(None), x.view(), x.view(), &cfg).expect("library");
    // `--backend wgpu` takes the adapter the environment selects, as the library's contexts
    // do (CI runs the suite on Vulkan, then with WGPU_BACKEND=gl; a Mac has Metal).
    let mut backends = vec!["cpu"];
    if common::gpu_context(None).is_some() {
        backends.push("wgpu");
    }
    for backend in backends {
        let (i, s) = (d.join("i.npy"), d.join("s.npy"));
        #[rustfmt::skip]
        let out = wml(&[
            "knn", "--queries", arg(&q), "-k", "3", "--distance", "squared-euclidean",
            "--no-normalize", "--out-indices", arg(&i), "--out-scores", arg(&s),
            "--backend", backend, "--stats", "--budget", "64MiB",
        ]);
        ok(&out);
        let got_i: Array2<i64> = read_npy(&i).expect("indices");
        let got_s: Array2<f32> = read_npy(&s).expect("scores");
        assert_eq!(got_i, want.indices.mapv(i64::from), "{backend}");
        for (g, w) in got_s.iter().zip(&want.scores) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{backend}: {g} vs {w}"
            );
        }
        let stats = String::from_utf8_lossy(&out.stderr);
        let line = stats
            .lines()
            .find(|l| l.starts_with("{\"op\": \"knn\""))
            .expect("stats line");
        assert_eq!(json_field(line, "budget_bytes"), (64u64 << 20) as f64);
        let path = if backend == "cpu" {
            "native-cpu"
        } else {
            "wgpu"
        };
        assert!(line.contains(&format!("\"path\": \"{path}\"")), "{line}");
        assert!(json_field(line, "seconds") >= 0.0);
        // The search is one query chunk here: the native path never waits for a device; the
        // wgpu path waits once, reading back the neighbour lists it uploaded the rows for.
        let waits = json_field(line, "host_waits");
        let (up, down) = (json_field(line, "bytes_up"), json_field(line, "bytes_down"));
        if backend == "cpu" {
            assert_eq!((waits, up, down), (0.0, 0.0, 0.0), "{line}");
        } else {
            assert_eq!(waits, 1.0, "{line}");
            assert!(
                up >= (x.len() * 4) as f64 && down >= (x.nrows() * 3 * 8) as f64,
                "{line}"
            );
        }
    }
}

#[test]
fn accuracy_prints_the_library_metrics_as_json() {
    let d = dir("accuracy");
    let (x, y) = clustered();
    let (xf, yf) = (d.join("x.npy"), d.join("y.npy"));
    write_npy(&xf, &x).expect("write");
    write_npy(&yf, &y.mapv(|v| v as i32)).expect("write");
    let cfg = AccuracyConfig {
        k: AccuracyK::MaxBinCount,
        distance: DistanceConfig {
            distance: Distance::SquaredEuclidean,
            normalize: false,
        },
        ..Default::default()
    };
    let want = accuracy(
        &Context::native_cpu(None),
        &MiningSet::new(&x, &y),
        None,
        &cfg,
    )
    .expect("library")
    .metrics;
    #[rustfmt::skip]
    let json = ok(&wml(&[
        "accuracy", "--embeddings", arg(&xf), "--labels", arg(&yf), "--k", "max_bin_count",
        "--no-normalize",
    ]));
    for (key, value) in [
        ("precision_at_1", want.precision_at_1),
        ("r_precision", want.r_precision),
        (
            "mean_average_precision_at_r",
            want.mean_average_precision_at_r,
        ),
        ("mean_average_precision", want.mean_average_precision),
        ("mean_reciprocal_rank", want.mean_reciprocal_rank),
    ] {
        assert!(
            (json_field(&json, key) - value).abs() < 1e-9,
            "{key}: {json}"
        );
    }
}

/// `--include` with PML's names prints those metrics only, NMI and AMI from the library's
/// k-means with `--seed`; a name PML does not have is a usage error.
#[test]
fn accuracy_includes_nmi_and_ami() {
    let d = dir("accuracy-nmi");
    let (x, y) = clustered();
    let (xf, yf) = (d.join("x.npy"), d.join("y.npy"));
    write_npy(&xf, &x).expect("write");
    write_npy(&yf, &y).expect("write");
    let cfg = AccuracyConfig {
        include: vec![
            AccuracyMetric::Nmi,
            AccuracyMetric::Ami,
            AccuracyMetric::RPrecision,
        ],
        kmeans: KmeansConfig {
            seed: 9,
            ..Default::default()
        },
        ..Default::default()
    };
    let ctx = Context::native_cpu(None);
    let want = accuracy(&ctx, &MiningSet::new(&x, &y), None, &cfg).expect("library");
    #[rustfmt::skip]
    let json = ok(&wml(&[
        "accuracy", "--embeddings", arg(&xf), "--labels", arg(&yf), "--include",
        "NMI,AMI,r_precision", "--seed", "9", "--backend", "cpu",
    ]));
    assert_eq!(json_field(&json, "NMI"), want.nmi.expect("nmi"), "{json}");
    assert_eq!(json_field(&json, "AMI"), want.ami.expect("ami"), "{json}");
    assert!((json_field(&json, "r_precision") - want.metrics.r_precision).abs() < 1e-12);
    assert!(!json.contains("precision_at_1"), "{json}");
    #[rustfmt::skip]
    let out = wml(&[
        "accuracy", "--embeddings", arg(&xf), "--labels", arg(&yf), "--include", "nmi",
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NMI"),
        "{out:?}"
    );
}

#[test]
fn miners_write_their_documented_files() {
    let d = dir("mine");
    let (x, y) = clustered();
    let (xf, yf) = (d.join("x.npy"), d.join("y.npy"));
    write_npy(&xf, &x).expect("write");
    write_npy(&yf, &y).expect("write");
    let ctx = Context::native_cpu(None);
    let set = MiningSet::new(&x, &y);
    let t = d.join("t.npy");
    #[rustfmt::skip]
    ok(&wml(&["mine", "--miner", "batch-hard", "--labels", arg(&yf), "--embeddings", arg(&xf), "--out", arg(&t)]));
    let want = batch_hard_triplets(&ctx, &set, None, &BatchHardConfig::default()).expect("lib");
    assert_eq!(
        read_npy::<_, Array2<i64>>(&t).expect("t"),
        want.indices.mapv(i64::from)
    );

    let (p, n) = (d.join("p.npy"), d.join("n.npy"));
    #[rustfmt::skip]
    ok(&wml(&[
        "mine", "--miner", "pair-margin", "--labels", arg(&yf), "--embeddings", arg(&xf),
        "--pos-margin", "0.1", "--neg-margin", "1.2",
        "--out-positives", arg(&p), "--out-negatives", arg(&n),
    ]));
    let cfg = PairMarginConfig {
        pos_margin: 0.1,
        neg_margin: 1.2,
        ..Default::default()
    };
    let want = pair_margin_pairs(&ctx, &set, None, &cfg).expect("lib");
    let got_p: Array2<i64> = read_npy(&p).expect("positives");
    let got_n: Array2<i64> = read_npy(&n).expect("negatives");
    assert_eq!(got_p, want.positives.mapv(i64::from));
    assert_eq!(got_n, want.negatives.mapv(i64::from));
    assert_eq!(got_p.ncols(), 2);
}

#[test]
fn the_sampling_miners_write_the_library_answers() {
    let d = dir("mine-sampling");
    let (x, y) = clustered();
    let (xf, yf) = (d.join("x.npy"), d.join("y.npy"));
    write_npy(&xf, &x).expect("write");
    write_npy(&yf, &y).expect("write");
    let ctx = Context::native_cpu(None);
    let set = MiningSet::new(&x, &y);
    let base = [
        "mine",
        "--backend",
        "cpu",
        "--labels",
        arg(&yf),
        "--embeddings",
        arg(&xf),
    ];
    let t = d.join("t.npy");
    let triplets = |miner: &str, flags: &[&str]| -> Array2<i64> {
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--miner", miner, "--out", arg(&t)])
            .chain(flags.iter().copied())
            .collect();
        ok(&wml(&args));
        read_npy(&t).expect("triplets")
    };
    let want = angular_triplets(
        &ctx,
        &set,
        None,
        &AngularConfig {
            angle: 5.0,
            ..Default::default()
        },
    )
    .expect("lib");
    assert!(want.indices.nrows() > 0);
    assert_eq!(
        triplets("angular", &["--angle", "5"]),
        want.indices.mapv(i64::from)
    );
    let cfg = DistanceWeightedConfig {
        cutoff: 0.3,
        nonzero_loss_cutoff: 1.3,
        seed: 9,
        ..Default::default()
    };
    let want = distance_weighted_triplets(&ctx, &set, None, &cfg).expect("lib");
    let got = triplets(
        "distance-weighted",
        &[
            "--cutoff",
            "0.3",
            "--nonzero-loss-cutoff",
            "1.3",
            "--seed",
            "9",
        ],
    );
    assert!(got.nrows() > 0);
    assert_eq!(got, want.indices.mapv(i64::from));

    let (p, n) = (d.join("p.npy"), d.join("n.npy"));
    let pairs = |miner: &str, flags: &[&str]| -> (Array2<i64>, Array2<i64>) {
        let args: Vec<&str> = base
            .iter()
            .copied()
            .chain([
                "--miner",
                miner,
                "--out-positives",
                arg(&p),
                "--out-negatives",
                arg(&n),
            ])
            .chain(flags.iter().copied())
            .collect();
        ok(&wml(&args));
        (
            read_npy(&p).expect("positives"),
            read_npy(&n).expect("negatives"),
        )
    };
    let cfg = HdcConfig {
        filter_percentage: 0.25,
        distance: DistanceConfig {
            distance: Distance::Cosine,
            normalize: true,
        },
        ..Default::default()
    };
    let want = hdc_pairs(&ctx, &set, None, &cfg).expect("lib");
    assert!(want.positives.nrows() > 0 && want.negatives.nrows() > 0);
    let got = pairs(
        "hdc",
        &["--filter-percentage", "0.25", "--distance", "cosine"],
    );
    assert_eq!(
        got,
        (
            want.positives.mapv(i64::from),
            want.negatives.mapv(i64::from)
        )
    );
    let cfg = UniformHistogramConfig {
        num_bins: 7,
        pos_per_bin: 2,
        neg_per_bin: 3,
        seed: 4,
        ..Default::default()
    };
    let want = uniform_histogram_pairs(&ctx, &set, None, &cfg).expect("lib");
    let got = pairs(
        "uniform-histogram",
        &[
            "--num-bins",
            "7",
            "--pos-per-bin",
            "2",
            "--neg-per-bin",
            "3",
            "--seed",
            "4",
        ],
    );
    assert_eq!(
        got,
        (
            want.positives.mapv(i64::from),
            want.negatives.mapv(i64::from)
        )
    );

    // PML fixes these miners' distance; a bad setting is one line, not a panic.
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain([
            "--miner",
            "angular",
            "--out",
            arg(&t),
            "--distance",
            "cosine",
        ])
        .collect();
    fails_with(&wml(&args), &["fixed distance"]);
    let args: Vec<&str> = base
        .iter()
        .copied()
        .chain([
            "--miner",
            "hdc",
            "--out-positives",
            arg(&p),
            "--out-negatives",
            arg(&n),
            "--filter-percentage",
            "2",
        ])
        .collect();
    fails_with(&wml(&args), &["filter_percentage"]);
}

#[test]
fn bad_input_exits_with_one_line_naming_the_file() {
    let d = dir("bad");
    let (x, y) = clustered();
    let files =
        ["x", "y", "short", "nan", "flat", "floaty", "garbage"].map(|f| d.join(format!("{f}.npy")));
    let [xf, yf, short, nan, flat, floaty, garbage] = &files;
    write_npy(xf, &x).expect("write");
    write_npy(yf, &y).expect("write");
    write_npy(short, &y.slice(ndarray::s![..5]).to_owned()).expect("write");
    let mut with_nan = x.clone();
    with_nan[[3, 1]] = f32::NAN;
    write_npy(nan, &with_nan).expect("write");
    write_npy(flat, &Array1::<f32>::zeros(4)).expect("write");
    write_npy(floaty, &Array1::<f32>::zeros(12)).expect("write");
    std::fs::write(garbage, b"not an npy file at all").expect("write");
    let missing = d.join("missing.npy");
    let out = d.join("o.npy");
    let (i, s) = (d.join("i.npy"), d.join("s.npy"));
    let knn_with = |q: &Path, k: &str| {
        wml(&[
            "knn",
            "--queries",
            arg(q),
            "-k",
            k,
            "--out-indices",
            arg(&i),
            "--out-scores",
            arg(&s),
        ])
    };
    fails_with(&knn_with(&missing, "3"), &["missing.npy"]);
    fails_with(&knn_with(garbage, "3"), &["garbage.npy", "npy"]);
    fails_with(&knn_with(flat, "3"), &["flat.npy", "2 dimension"]);
    fails_with(&knn_with(nan, "3"), &["nan.npy", "non-finite", "row 3"]);
    fails_with(&knn_with(xf, "0"), &["x.npy", "k = 0"]);
    fails_with(&knn_with(xf, "12"), &["x.npy", "k = 12"]);
    fails_with(
        &wml(&["triplets", "--labels", arg(floaty), "--out", arg(&out)]),
        &["floaty.npy", "int32, int64 or uint32", "<f4"],
    );
    #[rustfmt::skip]
    fails_with(
        &wml(&["triplets", "--labels", arg(short), "--embeddings", arg(xf), "--type", "hard", "--out", arg(&out)]),
        &["short.npy", "x.npy"],
    );
    fails_with(
        &wml(&[
            "triplets",
            "--labels",
            arg(yf),
            "--type",
            "hard",
            "--out",
            arg(&out),
        ]),
        &["--embeddings"],
    );
    #[rustfmt::skip]
    fails_with(
        &wml(&["triplets", "--labels", arg(yf), "--embeddings", arg(xf), "--margin", "NaN", "--out", arg(&out)]),
        &["margin"],
    );
    #[rustfmt::skip]
    fails_with(
        &wml(&["accuracy", "--embeddings", arg(xf), "--labels", arg(short)]),
        &["short.npy", "x.npy"],
    );
    // A header that claims far more data than the file holds is refused before any
    // allocation (the reader would otherwise ask for petabytes and abort).
    let bytes = std::fs::read(xf).expect("read");
    let shape = format!("({}, {})", x.nrows(), x.ncols());
    let forged_shape = format!("({}, {})", 9_999_999, x.ncols());
    let at = bytes
        .windows(shape.len())
        .position(|w| w == shape.as_bytes())
        .expect("shape in the header");
    let newline = bytes.iter().position(|&b| b == b'\n').expect("header end");
    let grow = forged_shape.len() - shape.len();
    let mut forged = bytes[..at].to_vec();
    forged.extend_from_slice(forged_shape.as_bytes());
    forged.extend_from_slice(&bytes[at + shape.len()..newline - grow]);
    forged.extend_from_slice(&bytes[newline..]);
    let huge = d.join("huge.npy");
    std::fs::write(&huge, forged).expect("write");
    fails_with(&knn_with(&huge, "3"), &["huge.npy", "needs more data"]);
    // A budget of 0 bytes cannot hold one tile.
    #[rustfmt::skip]
    fails_with(
        &wml(&["knn", "--queries", arg(xf), "-k", "3", "--budget", "0", "--backend", "cpu",
               "--out-indices", arg(&i), "--out-scores", arg(&s)]),
        &["budget"],
    );
    // A malformed command line is clap's: status 2 and a usage message.
    let usage = wml(&["knn", "--queries", arg(xf)]);
    assert_eq!(usage.status.code(), Some(2));
    let budget = wml(&[
        "triplets",
        "--labels",
        arg(yf),
        "--count-only",
        "--budget",
        "12 parsecs",
    ]);
    assert_eq!(budget.status.code(), Some(2));
}

/// Runs `wml` with `XDG_RUNTIME_DIR` unset (a container, ssh without a session), as users
/// meet it: a successful run must print nothing on stderr, although Mesa's Vulkan layer would
/// complain that it cannot reach a Wayland display.
#[test]
fn a_successful_run_prints_no_error_line_without_a_runtime_dir() {
    let d = dir("quiet");
    let (x, _) = clustered();
    let q = d.join("q.npy");
    write_npy(&q, &x).expect("write");
    let (i, s) = (d.join("i.npy"), d.join("s.npy"));
    let out = Command::new(env!("CARGO_BIN_EXE_wml"))
        .args(["knn", "--queries", arg(&q), "-k", "2"])
        .args(["--out-indices", arg(&i), "--out-scores", arg(&s)])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("NODEVICE_SELECT")
        .output()
        .expect("run wml");
    ok(&out);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "nothing on stderr after a successful run"
    );
}

/// Ctrl-C (SIGINT) in the middle of a search: `wml` stops at the next chunk, says so in one
/// line, exits with status 130 and writes no output.
#[cfg(unix)]
#[test]
fn ctrl_c_stops_wml_cleanly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let d = dir("sigint");
    // 30 000 × 30 000 × 64: about a second of work natively, in 118 blocks of queries.
    let x = Array2::from_shape_fn((30_000, 64), |(i, k)| ((i * 31 + k * 7) % 97) as f32);
    let q = d.join("q.npy");
    write_npy(&q, &x).expect("write");
    let (i, s) = (d.join("i.npy"), d.join("s.npy"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_wml"))
        .args([
            "knn",
            "--backend",
            "cpu",
            "--progress",
            "--queries",
            arg(&q),
            "-k",
            "5",
        ])
        .args(["--out-indices", arg(&i), "--out-scores", arg(&s)])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wml");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    // The first progress line: the search is under way.
    let mut first = String::new();
    err.read_line(&mut first).expect("a progress line");
    assert!(
        first.starts_with("wml: ") && first.contains('%'),
        "{first:?}"
    );
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(kill.success(), "signal sent");
    let status = child.wait().expect("wml exits");
    let mut rest = String::new();
    for line in err.lines() {
        rest.push_str(&line.expect("utf-8"));
        rest.push('\n');
    }
    let last = rest.lines().last().unwrap_or_default();
    assert_eq!(status.code(), Some(130), "exit status; stderr: {rest}");
    assert_eq!(last, "wml: cancelled (Ctrl-C); no output was written");
    assert!(!rest.contains("100%"), "stopped before the end: {rest}");
    assert!(!i.exists() && !s.exists(), "no output file");
}

#[test]
fn pair_losses_print_their_json_and_write_the_library_gradients() {
    let d = dir("pair_loss");
    let (x, y) = clustered();
    let (r, ry) = (x.mapv(|v| v * 0.9 + 0.05), y.mapv(|l| (l + 1) % 3));
    write_npy(d.join("x.npy"), &x).expect("write");
    write_npy(d.join("r.npy"), &r).expect("write");
    write_npy(d.join("y.npy"), &y).expect("write");
    write_npy(d.join("ry.npy"), &ry).expect("write");
    let p = |n: &str| d.join(n);
    let ctx = Context::native_cpu(None);
    let (batch, refs) = (MiningSet::new(&x, &y), MiningSet::new(&r, &ry));
    let files: Vec<_> = ["x", "y", "r", "ry", "g", "rg"]
        .iter()
        .map(|n| p(&format!("{n}.npy")))
        .collect();
    let raw = |args: &[&str]| {
        let flags = [
            "--embeddings",
            "--labels",
            "--ref-embeddings",
            "--ref-labels",
            "--grad-out",
            "--ref-grad-out",
        ];
        let mut all = vec!["loss", args[0], "--backend", "cpu"];
        for (flag, file) in flags.iter().zip(&files) {
            all.extend([*flag, arg(file)]);
        }
        all.extend_from_slice(&args[1..]);
        wml(&all)
    };
    let run = |args: &[&str]| ok(&raw(args));
    let check = |out: &str, want: PairLoss| {
        assert_eq!(json_field(out, "loss"), f64::from(want.loss), "{out}");
        assert_eq!(json_field(out, "nonzero"), want.nonzero as f64, "{out}");
        assert_eq!(
            json_field(out, "negative_pairs"),
            want.negative_pairs as f64
        );
        let g: Array2<f32> = read_npy(p("g.npy")).expect("grad");
        let rg: Array2<f32> = read_npy(p("rg.npy")).expect("ref grad");
        assert_eq!((g, Some(rg)), (want.query_grad, want.ref_grad));
    };
    fn with<R: PairLossRule>(rule: R) -> PairLossConfig<R> {
        PairLossConfig {
            rule,
            ref_grad: true,
            ..Default::default()
        }
    }
    let out = run(&["contrastive", "--pos-margin", "0.1", "--neg-margin", "0.8"]);
    let rule = Contrastive {
        pos_margin: 0.1,
        neg_margin: 0.8,
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&[
        "multi-similarity",
        "--alpha",
        "3",
        "--beta",
        "40",
        "--base",
        "0.4",
    ]);
    let rule = MultiSimilarity {
        alpha: 3.0,
        beta: 40.0,
        base: 0.4,
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["supcon", "--temperature", "0.2"]);
    let rule = SupCon { temperature: 0.2 };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["circle", "--m", "0.25", "--gamma", "64"]);
    let rule = Circle {
        m: 0.25,
        gamma: 64.0,
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["nca", "--softmax-scale", "2"]);
    let rule = Nca { softmax_scale: 2.0 };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&[
        "generalized-lifted",
        "--pos-margin",
        "0.1",
        "--neg-margin",
        "0.9",
    ]);
    let rule = GeneralizedLifted {
        pos_margin: 0.1,
        neg_margin: 0.9,
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["margin", "--beta", "0.9", "--nu", "0.1", "--learn-beta"]);
    let rule = Margin {
        beta: 0.9,
        nu: 0.1,
        learn_beta: true,
        ..Default::default()
    };
    let want = pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss");
    let beta_grad = f64::from(want.beta_grad.expect("learnt β"));
    assert_eq!(json_field(&out, "beta_grad"), beta_grad, "{out}");
    check(&out, want);
    let out = run(&["fast-ap", "--num-bins", "20"]);
    let rule = FastAp { num_bins: 20 };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["lifted-structure", "--neg-margin", "0.9"]);
    let rule = LiftedStructure {
        neg_margin: 0.9,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["tuplet-margin", "--margin", "10", "--scale", "16"]);
    let rule = TupletMargin {
        margin: 10.0,
        scale: 16.0,
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["intra-pair-variance", "--pos-eps", "0.05"]);
    let rule = IntraPairVariance {
        pos_eps: 0.05,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["ranked-list", "--margin", "0.5", "--tn", "2", "--tp", "1"]);
    let rule = RankedList {
        margin: 0.5,
        tn: 2.0,
        tp: 1.0,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["snr-contrastive", "--neg-margin", "2"]);
    let rule = SnrContrastive {
        neg_margin: 2.0,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["dynamic-soft-margin", "--min-val", "-3", "--num-bins", "12"]);
    let rule = DynamicSoftMargin {
        min_val: -3.0,
        num_bins: 12,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    let out = run(&["angular", "--alpha", "35"]);
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(Angular { alpha: 35.0 })).expect("loss"),
    );
    let out = run(&["threshold-consistent-margin", "--margin-minus", "0.2"]);
    let rule = ThresholdConsistentMargin {
        margin_minus: 0.2,
        ..Default::default()
    };
    check(
        &out,
        pair_loss(&ctx, &batch, Some(&refs), &with(rule)).expect("loss"),
    );
    // Circle on a distance, Histogram with references: one line naming the parameter,
    // status 1.
    fails_with(
        &raw(&["circle", "--distance", "euclidean"]),
        &["distance", "cosine"],
    );
    fails_with(&raw(&["histogram", "--n-bins", "20"]), &["refs", "None"]);
    // PNP and NPairs take no references: the batch alone.
    let (x_file, y_file, g_file) = (p("x.npy"), p("y.npy"), p("g.npy"));
    let batch_only = |args: &[&str], want: PairLoss| {
        let mut all = vec!["loss", args[0], "--backend", "cpu"];
        all.extend(["--embeddings", arg(&x_file), "--labels", arg(&y_file)]);
        all.extend(["--grad-out", arg(&g_file)]);
        all.extend_from_slice(&args[1..]);
        let out = ok(&wml(&all));
        assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
        assert_eq!(json_field(&out, "nonzero"), want.nonzero as f64, "{out}");
        let g: Array2<f32> = read_npy(&g_file).expect("grad");
        assert_eq!(g, want.query_grad);
    };
    let rule = Pnp {
        variant: PnpVariant::Dq,
        anneal: 0.1,
        ..Default::default()
    };
    let cfg = PairLossConfig {
        rule,
        ..Default::default()
    };
    let want = pair_loss(&ctx, &batch, None, &cfg).expect("loss");
    batch_only(&["pnp", "--variant", "dq", "--anneal", "0.1"], want);
    let cfg = PairLossConfig::<NPairs>::default();
    batch_only(
        &["n-pairs"],
        pair_loss(&ctx, &batch, None, &cfg).expect("loss"),
    );
    let cfg = PairLossConfig {
        rule: Instance { gamma: 8.0 },
        ..Default::default()
    };
    batch_only(
        &["instance", "--gamma", "8"],
        pair_loss(&ctx, &batch, None, &cfg).expect("loss"),
    );
}

#[test]
fn losses_print_their_json_and_write_the_library_gradients() {
    let d = dir("loss");
    let (x, y) = clustered();
    let (r, ry) = (x.mapv(|v| v * 0.9 + 0.05), y.mapv(|l| (l + 1) % 3));
    let files = [("x", &x), ("r", &r)];
    for (name, a) in files {
        write_npy(d.join(format!("{name}.npy")), a).expect("write");
    }
    write_npy(d.join("y.npy"), &y).expect("write");
    write_npy(d.join("ry.npy"), &ry).expect("write");
    let p = |n: &str| d.join(n);
    let ctx = Context::native_cpu(None);
    let (batch, refs) = (MiningSet::new(&x, &y), MiningSet::new(&r, &ry));

    let out = ok(&wml(&[
        "loss",
        "triplet-margin",
        "--embeddings",
        arg(&p("x.npy")),
        "--labels",
        arg(&p("y.npy")),
        "--ref-embeddings",
        arg(&p("r.npy")),
        "--ref-labels",
        arg(&p("ry.npy")),
        "--margin",
        "0.3",
        "--type",
        "semihard",
        "--swap",
        "--grad-out",
        arg(&p("g.npy")),
        "--ref-grad-out",
        arg(&p("rg.npy")),
        "--backend",
        "cpu",
    ]));
    let cfg = TripletLossConfig {
        margin: 0.3,
        triplets: TripletRule::margin_miner(TripletType::Semihard),
        swap: true,
        ref_grad: true,
        ..Default::default()
    };
    let want = triplet_margin_loss(&ctx, &batch, Some(&refs), &cfg).expect("loss");
    assert!(want.nonzero > 0);
    let unswapped = TripletLossConfig {
        swap: false,
        ..cfg.clone()
    };
    let plain = triplet_margin_loss(&ctx, &batch, Some(&refs), &unswapped).expect("loss");
    assert_ne!(plain.loss, want.loss, "the swap changes this loss");
    assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
    assert_eq!(json_field(&out, "nonzero"), want.nonzero as f64);
    assert_eq!(json_field(&out, "triplets"), want.triplets as f64);
    let g: Array2<f32> = read_npy(p("g.npy")).expect("grad");
    let rg: Array2<f32> = read_npy(p("rg.npy")).expect("ref grad");
    assert_eq!((g, Some(rg)), (want.query_grad, want.ref_grad));

    let out = ok(&wml(&[
        "loss",
        "ntxent",
        "--embeddings",
        arg(&p("x.npy")),
        "--labels",
        arg(&p("y.npy")),
        "--temperature",
        "0.2",
        "--grad-out",
        arg(&p("gn.npy")),
        "--backend",
        "cpu",
    ]));
    let cfg = InfoNceConfig {
        temperature: 0.2,
        ..Default::default()
    };
    let want = ntxent_loss(&ctx, &batch, None, &cfg).expect("loss");
    assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
    assert_eq!(
        json_field(&out, "positive_pairs"),
        want.positive_pairs as f64
    );
    assert_eq!(
        read_npy::<_, Array2<f32>>(p("gn.npy")).expect("grad"),
        want.query_grad
    );

    let out = ok(&wml(&[
        "loss",
        "mnrl",
        "--anchors",
        arg(&p("x.npy")),
        "--candidates",
        arg(&p("r.npy")),
        "--grad-out",
        arg(&p("ga.npy")),
        "--candidates-grad-out",
        arg(&p("gc.npy")),
        "--backend",
        "cpu",
    ]));
    let want = multiple_negatives_ranking_loss(&ctx, &x, &r, &MnrlConfig::default()).expect("loss");
    assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
    assert_eq!(
        read_npy::<_, Array2<f32>>(p("gc.npy")).expect("grad"),
        want.ref_grad.expect("candidates")
    );
    // Matryoshka widths: the weighted sum, and each width's loss in the given order.
    let out = ok(&wml(&[
        "loss",
        "mnrl",
        "--anchors",
        arg(&p("x.npy")),
        "--candidates",
        arg(&p("r.npy")),
        "--grad-out",
        arg(&p("ga.npy")),
        "--matryoshka-dims",
        "5,2",
        "--matryoshka-weights",
        "1,0.5",
        "--backend",
        "cpu",
    ]));
    let cfg = MnrlConfig {
        matryoshka: Some(Matryoshka {
            dims: vec![5, 2],
            weights: vec![1.0, 0.5],
        }),
        ..Default::default()
    };
    let want = multiple_negatives_ranking_loss(&ctx, &x, &r, &cfg).expect("loss");
    assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
    let listed = format!(
        "\"matryoshka_losses\": [{}, {}]",
        f64::from(want.matryoshka_losses[0]),
        f64::from(want.matryoshka_losses[1])
    );
    assert!(out.contains(&listed), "{out} lacks {listed}");
    assert_eq!(
        read_npy::<_, Array2<f32>>(p("ga.npy")).expect("grad"),
        want.query_grad
    );
    // A width past the embeddings' and a weight count that differs: typed, status 1.
    for (dims, weights) in [("9", "1"), ("2,3", "1")] {
        fails_with(
            &wml(&[
                "loss",
                "mnrl",
                "--anchors",
                arg(&p("x.npy")),
                "--candidates",
                arg(&p("r.npy")),
                "--grad-out",
                arg(&p("ga.npy")),
                "--matryoshka-dims",
                dims,
                "--matryoshka-weights",
                weights,
                "--backend",
                "cpu",
            ]),
            &["matryoshka"],
        );
    }
    // Fewer candidates than anchors: one line, status 1.
    fails_with(
        &wml(&[
            "loss",
            "mnrl",
            "--anchors",
            arg(&p("x.npy")),
            "--candidates",
            arg(&p("y.npy")),
            "--grad-out",
            arg(&p("ga.npy")),
            "--backend",
            "cpu",
        ]),
        &["y.npy"],
    );
}

#[test]
fn vicreg_prints_its_terms_and_writes_both_gradients() {
    let d = dir("vicreg");
    let (x, _) = clustered();
    let x2 = x.mapv(|v| v * 0.8 + 0.1);
    write_npy(d.join("x.npy"), &x).expect("write");
    write_npy(d.join("x2.npy"), &x2).expect("write");
    let p = |n: &str| d.join(n);
    let out = ok(&wml(&[
        "loss",
        "vicreg",
        "--embeddings",
        arg(&p("x.npy")),
        "--ref-embeddings",
        arg(&p("x2.npy")),
        "--covariance-v",
        "2",
        "--grad-out",
        arg(&p("g.npy")),
        "--ref-grad-out",
        arg(&p("rg.npy")),
        "--backend",
        "cpu",
    ]));
    let cfg = VicRegConfig {
        covariance_v: 2.0,
        ..Default::default()
    };
    let ctx = Context::native_cpu(None);
    let want = vicreg_loss(&ctx, x.view(), Some(x2.view()), &cfg).expect("loss");
    for (field, value) in [
        ("loss", want.loss),
        ("invariance", want.invariance),
        ("variance", want.variance),
        ("covariance", want.covariance),
    ] {
        assert_eq!(json_field(&out, field), f64::from(value), "{out}");
    }
    let g: Array2<f32> = read_npy(p("g.npy")).expect("grad");
    let rg: Array2<f32> = read_npy(p("rg.npy")).expect("ref grad");
    assert_eq!((g, Some(rg)), (want.grad, want.ref_grad));
    // Labels are not VICReg's: one row is too few.
    let one = x.slice(ndarray::s![..1, ..]).to_owned();
    write_npy(d.join("one.npy"), &one).expect("write");
    let (one_file, g1) = (p("one.npy"), p("g1.npy"));
    let bad = [
        "loss",
        "vicreg",
        "--embeddings",
        arg(&one_file),
        "--grad-out",
        arg(&g1),
        "--backend",
        "cpu",
    ];
    fails_with(&wml(&bad), &["n >= 2"]);
}

#[test]
fn classifier_losses_print_their_loss_and_write_both_gradients() {
    use wgpu_metric_learning::{
        classifier_loss, ClassSampling, ClassifierKind, ClassifierLossConfig, MarginGrad,
    };
    let d = dir("classifier");
    let (x, labels) = clustered();
    let p = |n: &str| d.join(n);
    write_npy(p("x.npy"), &x).expect("write");
    write_npy(p("y.npy"), &labels).expect("write");
    let cases = [
        (
            "arcface",
            vec!["--margin-grad", "straight-through"],
            ClassifierKind::ArcFace {
                margin: 28.6,
                scale: 64.0,
                margin_grad: MarginGrad::StraightThrough,
            },
        ),
        (
            "sub-center-arcface",
            vec!["--sub-centers", "2"],
            ClassifierKind::SubCenterArcFace {
                margin: 28.6,
                scale: 64.0,
                sub_centers: 2,
                margin_grad: MarginGrad::Pml,
            },
        ),
        (
            "cosface",
            vec!["--scale", "30"],
            ClassifierKind::CosFace {
                margin: 0.35,
                scale: 30.0,
            },
        ),
        (
            "large-margin-softmax",
            vec!["--margin", "3"],
            ClassifierKind::LargeMarginSoftmax {
                margin: 3,
                scale: 1.0,
            },
        ),
        ("sphereface", vec![], ClassifierKind::sphere_face()),
        (
            "normalized-softmax",
            vec!["--temperature", "0.1"],
            ClassifierKind::NormalizedSoftmax { temperature: 0.1 },
        ),
        ("proxy-nca", vec![], ClassifierKind::proxy_nca()),
        (
            "proxy-anchor",
            vec!["--alpha", "16"],
            ClassifierKind::ProxyAnchor {
                margin: 0.1,
                alpha: 16.0,
            },
        ),
        (
            "soft-triple",
            vec!["--centers-per-class", "2"],
            ClassifierKind::SoftTriple {
                centers_per_class: 2,
                la: 20.0,
                gamma: 0.1,
                margin: 0.01,
            },
        ),
    ];
    for (name, extra, kind) in cases {
        let (r, c) = kind.weight_shape(3, 5);
        let w = Array2::from_shape_fn((r, c), |(i, j)| ((i * 5 + j * 3) % 7) as f32 / 7.0 - 0.4);
        write_npy(p("w.npy"), &w).expect("write");
        let (xf, yf, wf, g, wg) = (p("x.npy"), p("y.npy"), p("w.npy"), p("g.npy"), p("wg.npy"));
        let mut args = vec!["loss", name, "--embeddings", arg(&xf)];
        args.extend([
            "--labels",
            arg(&yf),
            "--weights",
            arg(&wf),
            "--grad-out",
            arg(&g),
        ]);
        args.extend(["--weight-grad-out", arg(&wg), "--backend", "cpu"]);
        args.extend(extra);
        let out = ok(&wml(&args));
        let cfg = ClassifierLossConfig {
            kind,
            ..Default::default()
        };
        let want = classifier_loss(
            &Context::native_cpu(None),
            x.view(),
            labels.as_slice().expect("labels"),
            w.view(),
            &cfg,
        )
        .expect("loss");
        assert_eq!(
            json_field(&out, "loss"),
            f64::from(want.loss),
            "{name}: {out}"
        );
        assert_eq!(
            json_field(&out, "count"),
            want.count as f64,
            "{name}: {out}"
        );
        let got: Array2<f32> = read_npy(&g).expect("grad");
        let got_w: Array2<f32> = read_npy(&wg).expect("weight grad");
        assert_eq!((got, got_w), (want.grad, want.weight_grad), "{name}");
    }
    // An option of another loss, a label past the classes.
    let (xf, yf, wf, g) = (p("x.npy"), p("y.npy"), p("w.npy"), p("g2.npy"));
    let base = [
        "loss",
        "cosface",
        "--embeddings",
        arg(&xf),
        "--labels",
        arg(&yf),
        "--grad-out",
        arg(&g),
    ];
    let mut bad = base.to_vec();
    bad.extend([
        "--weights",
        arg(&wf),
        "--temperature",
        "0.1",
        "--backend",
        "cpu",
    ]);
    fails_with(
        &wml(&bad),
        &["--temperature does not apply to loss cosface"],
    );
    let narrow = Array2::<f32>::ones((5, 2));
    write_npy(p("narrow.npy"), &narrow).expect("write");
    let nf = p("narrow.npy");
    let mut bad = base.to_vec();
    bad.extend(["--weights", arg(&nf), "--backend", "cpu"]);
    fails_with(&wml(&bad), &["labels", "2 classes"]);
    assert!(!g.exists(), "no gradient file after a failure");
    // PartialFC's sampling: the library's answer over its sample, and its refusals.
    let kind = ClassifierKind::cos_face();
    let (r, c) = kind.weight_shape(40, 5);
    let w = Array2::from_shape_fn((r, c), |(i, j)| ((i * 5 + j * 3) % 7) as f32 / 7.0 - 0.4);
    write_npy(p("w40.npy"), &w).expect("write");
    let wf = p("w40.npy");
    let mut sampled = base.to_vec();
    sampled.extend(["--weights", arg(&wf), "--backend", "cpu"]);
    sampled.extend(["--sample-rate", "0.2", "--seed", "4"]);
    let out = ok(&wml(&sampled));
    let cfg = ClassifierLossConfig {
        kind,
        sampling: ClassSampling { rate: 0.2, seed: 4 },
        ..Default::default()
    };
    let labels = labels.as_slice().expect("labels");
    let want = classifier_loss(&Context::native_cpu(None), x.view(), labels, w.view(), &cfg)
        .expect("sampled loss");
    assert!(want.classes_used < 40, "{}", want.classes_used);
    assert_eq!(json_field(&out, "loss"), f64::from(want.loss), "{out}");
    assert_eq!(json_field(&out, "classes_used"), want.classes_used as f64);
    let got: Array2<f32> = read_npy(&g).expect("grad");
    assert_eq!(got, want.grad);
    let mut bad = base.to_vec();
    bad.extend(["--weights", arg(&wf), "--seed", "4", "--backend", "cpu"]);
    fails_with(&wml(&bad), &["--seed needs --sample-rate"]);
    let mut bad = base.to_vec();
    bad.extend([
        "--weights",
        arg(&wf),
        "--sample-rate",
        "1.5",
        "--backend",
        "cpu",
    ]);
    fails_with(&wml(&bad), &["sampling.rate"]);
}

/// `WML_NATIVE_ISA` caps the native loops' vectors (AVX-512, AVX2, the baseline): every copy
/// gives the same bits, in the kNN's fused tiles, the distance epilogue, the pair losses'
/// rows and softmax, Matryoshka's rows and the classifier losses' passes. On a CPU with fewer
/// sets, the caps above it run what it has.
#[test]
fn every_instruction_set_gives_the_same_bits() {
    let d = dir("isa");
    let p = |n: &str| d.join(n);
    // Sizes off every vector width, so that the main loops and their tails both run.
    let x = Array2::from_shape_fn((203, 37), |(i, j)| {
        ((i * 131 + j * 71) % 97) as f32 / 48.0 - 1.0 + (i % 5) as f32 * 0.01
    });
    let y = Array1::from_shape_fn(203, |i| (i % 7) as i64);
    let w = Array2::from_shape_fn((37, 7), |(i, j)| ((i * 5 + j * 3) % 11) as f32 / 11.0 - 0.4);
    write_npy(p("x.npy"), &x).expect("write");
    write_npy(p("y.npy"), &y).expect("write");
    write_npy(p("w.npy"), &w).expect("write");
    let (xf, yf, wf) = (p("x.npy"), p("y.npy"), p("w.npy"));
    let (i, s, g, wg) = (p("i.npy"), p("s.npy"), p("g.npy"), p("wg.npy"));
    #[rustfmt::skip]
    let runs: [(Vec<&str>, Vec<&Path>); 5] = [
        (vec!["knn", "--queries", arg(&xf), "-k", "10", "--distance", "cosine",
              "--out-indices", arg(&i), "--out-scores", arg(&s)], vec![&i, &s]),
        (vec!["loss", "contrastive", "--embeddings", arg(&xf), "--labels", arg(&yf),
              "--grad-out", arg(&g)], vec![&g]),
        (vec!["loss", "supcon", "--embeddings", arg(&xf), "--labels", arg(&yf),
              "--grad-out", arg(&g)], vec![&g]),
        (vec!["loss", "mnrl", "--anchors", arg(&xf), "--candidates", arg(&xf),
              "--matryoshka-dims", "37,20,3", "--grad-out", arg(&g)], vec![&g]),
        (vec!["loss", "arcface", "--embeddings", arg(&xf), "--labels", arg(&yf),
              "--weights", arg(&wf), "--grad-out", arg(&g), "--weight-grad-out", arg(&wg)],
         vec![&g, &wg]),
    ];
    // `wml args --backend cpu` under `WML_NATIVE_ISA=cap`.
    let under = |cap: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_wml"))
            .args(args)
            .args(["--backend", "cpu"])
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .env("WML_NATIVE_ISA", cap)
            // The fused kNN kernel is the small search's own choice; no timing.
            .env("WML_TUNE_CACHE", p("tune.tsv"))
            .output()
            .expect("run wml")
    };
    for (args, files) in runs {
        let mut first: Option<(String, Vec<Vec<u8>>)> = None;
        for cap in ["", "avx512", "avx2", "baseline"] {
            let stdout = ok(&under(cap, &args));
            let bytes: Vec<Vec<u8>> = files
                .iter()
                .map(|f| std::fs::read(f).expect("output"))
                .collect();
            match &first {
                None => first = Some((stdout, bytes)),
                Some((want_out, want_bytes)) => {
                    assert_eq!(&stdout, want_out, "{} under {cap}", args[..2].join(" "));
                    assert!(&bytes == want_bytes, "{} under {cap}", args[..2].join(" "));
                }
            }
        }
    }
    // An unknown set is named on stderr and ignored; `--stats` names the set in use (the
    // baseline is under every CPU's).
    let small = ["knn", "--queries", arg(&xf), "-k", "2"];
    let outs = ["--out-indices", arg(&i), "--out-scores", arg(&s)];
    let out = under("sse9", &[&small[..], &outs[..]].concat());
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("WML_NATIVE_ISA=\"sse9\""), "{err}");
    let out = under("Baseline", &[&small[..], &outs[..], &["--stats"]].concat());
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"native_isa\": \"baseline\""), "{err}");
}

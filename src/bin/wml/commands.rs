//! The subcommands: read the inputs, run one library operation (timed for `--stats`), write
//! the outputs.

use std::path::Path;
use std::time::Instant;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    accuracy as accuracy_op, angular_triplets, batch_easy_hard_pairs, batch_hard_triplets,
    count_triplets, distance_weighted_triplets, hdc_pairs, knn as knn_op, mine_triplets,
    multi_similarity_pairs, pair_margin_pairs, uniform_histogram_pairs, Accuracy, AccuracyConfig,
    AccuracyMetric, AngularConfig, BackendChoice, BatchEasyHardConfig, BatchHardConfig,
    ComputePath, Context, ContextConfig, Distance, DistanceConfig, DistanceWeightedConfig, Error,
    HdcConfig, Hooks, KmeansConfig, KnnConfig, MiningSet, MultiSimilarityConfig, PairMarginConfig,
    Pairs, SelfExclusion, Strategy, TripletConfig, TripletRule, TripletType,
    UniformHistogramConfig,
};

use crate::npy::{self, problem};
use crate::{
    AccuracyArgs, BackendArg, Common, DistanceArg, Failure, KnnArgs, Metric, MineArgs, MinerArg,
    StrategyArg, TripletsArgs, TypeArg,
};

/// The context the common options ask for.
pub(crate) fn context(common: &Common) -> Result<Context, String> {
    Context::new(&context_config(common)).map_err(|e| format!("--backend: {}", with_causes(&e)))
}

/// The context configuration the common options ask for.
pub(crate) fn context_config(common: &Common) -> ContextConfig {
    let (backend, backends) = match common.backend {
        BackendArg::Auto => (BackendChoice::Auto, None),
        BackendArg::Cpu => (BackendChoice::NativeCpu, None),
        BackendArg::Wgpu => (BackendChoice::Wgpu, None),
        BackendArg::Vulkan => (BackendChoice::Wgpu, Some(wgpu::Backends::VULKAN)),
        BackendArg::Metal => (BackendChoice::Wgpu, Some(wgpu::Backends::METAL)),
        BackendArg::Dx12 => (BackendChoice::Wgpu, Some(wgpu::Backends::DX12)),
        BackendArg::Gl => (BackendChoice::Wgpu, Some(wgpu::Backends::GL)),
    };
    ContextConfig {
        backend,
        wgpu_backends: backends,
        budget_bytes: common.budget,
        // --stats reports each kernel's GPU time (two timestamps per dispatch).
        kernel_timing: common.stats,
        ..Default::default()
    }
}

/// An error and its causes (a wgpu error keeps wgpu's as its source), on one line.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        message = format!("{message}: {c}");
        cause = c.source();
    }
    message.replace('\n', " ")
}

/// Runs `op` on `ctx`, printing the `--stats` line when asked; a library error is prefixed
/// with the inputs it concerns, a cancellation (Ctrl-C) reported as such.
pub(crate) fn timed<T>(
    name: &str,
    ctx: &Context,
    common: &Common,
    inputs: &[(&str, &Path)],
    op: impl FnOnce() -> wgpu_metric_learning::Result<T>,
) -> Result<T, Failure> {
    let before = ctx.transfers();
    let start = Instant::now();
    let out = op();
    let seconds = start.elapsed().as_secs_f64();
    let after = ctx.transfers();
    let out = out.map_err(|e| {
        if let Error::Cancelled { .. } = e {
            return Failure::Cancelled;
        }
        let files: Vec<String> = inputs
            .iter()
            .map(|(flag, path)| format!("--{flag} {}", path.display()))
            .collect();
        Failure::Message(format!(
            "{name} ({}): {}",
            files.join(", "),
            with_causes(&e)
        ))
    })?;
    if common.stats {
        let mem = ctx.memory();
        let path = match ctx.path() {
            ComputePath::Wgpu => "wgpu",
            ComputePath::NativeCpu => "native-cpu",
        };
        let t = after.since(&before);
        let h = &t.host;
        let kernels = match ctx.kernel_timing() {
            Ok(true) => {
                let lines: Vec<String> = t
                    .kernels
                    .iter()
                    .map(|k| {
                        format!(
                            "\"{}\": {{\"dispatches\": {}, \"gpu_seconds\": {:.6}}}",
                            k.stem, k.dispatches, k.gpu_seconds
                        )
                    })
                    .collect();
                format!("\"kernels\": {{{}}}", lines.join(", "))
            }
            Ok(false) => "\"kernel_timing\": \"off\"".to_string(),
            Err(reason) => format!(
                "\"kernel_timing\": {}",
                json_string(&format!("unavailable: {reason}"))
            ),
        };
        eprintln!(
            "{{\"op\": \"{name}\", \"seconds\": {seconds:.6}, \"peak_device_bytes\": {}, \"budget_bytes\": {}, \"host_waits\": {}, \"submissions\": {}, \"bytes_up\": {}, \"bytes_down\": {}, \"host\": {{\"upload_seconds\": {:.6}, \"wait_seconds\": {:.6}, \"readback_seconds\": {:.6}, \"tune_seconds\": {:.6}, \"submit_seconds\": {:.6}}}, {kernels}, \"adapter\": {}, \"path\": \"{path}\", \"native_isa\": \"{}\"}}",
            mem.peak_bytes,
            mem.budget_bytes,
            t.host_waits,
            t.submissions,
            t.bytes_up,
            t.bytes_down,
            h.seconds(h.upload_ns),
            h.seconds(h.wait_ns),
            h.seconds(h.readback_ns),
            h.seconds(h.tune_ns),
            h.seconds(h.submit_ns),
            json_string(&ctx.device_name()),
            wgpu_metric_learning::native_isa()
        );
    }
    Ok(out)
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number; NaN (every query lone) as `null`, which JSON has no number for.
pub(crate) fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v}")
    } else {
        "null".into()
    }
}

pub(crate) fn distance_config(metric: &Metric, default: Distance) -> DistanceConfig {
    let distance = match metric.distance {
        None => default,
        Some(DistanceArg::Euclidean) => Distance::Euclidean,
        Some(DistanceArg::SquaredEuclidean) => Distance::SquaredEuclidean,
        Some(DistanceArg::Cosine) => Distance::Cosine,
        Some(DistanceArg::Dot) => Distance::DotProduct,
    };
    DistanceConfig {
        distance,
        normalize: !metric.no_normalize,
    }
}

/// Labels and optional embeddings of one side, as read from disk.
pub(crate) struct Side {
    labels: Array1<i64>,
    embeddings: Option<Array2<f32>>,
}

impl Side {
    pub(crate) fn read(labels: &Path, embeddings: Option<&Path>) -> Result<Self, String> {
        Ok(Self {
            labels: npy::read_labels(labels)?,
            embeddings: embeddings.map(npy::read_embeddings).transpose()?,
        })
    }

    pub(crate) fn set(&self) -> MiningSet<'_, i64> {
        match &self.embeddings {
            Some(e) => MiningSet::new(e, &self.labels),
            None => MiningSet::from_labels(&self.labels),
        }
    }
}

/// The input files that were given, for messages.
pub(crate) fn given<'a>(inputs: &[(&'a str, Option<&'a Path>)]) -> Vec<(&'a str, &'a Path)> {
    inputs
        .iter()
        .filter_map(|&(flag, path)| path.map(|p| (flag, p)))
        .collect()
}

pub(crate) fn triplets(a: &TripletsArgs, hooks: &Hooks) -> Result<(), Failure> {
    let margin_flags = a.kind.is_some() || a.margin.is_some() || a.metric.distance.is_some();
    if a.embeddings.is_none() && (margin_flags || a.metric.no_normalize) {
        return Err(
            "--type, --margin, --distance and --no-normalize need --embeddings (labels alone \
             give every valid triplet)"
                .into(),
        );
    }
    if a.ref_embeddings.is_some() && a.ref_labels.is_none() {
        return Err("--ref-embeddings needs --ref-labels".into());
    }
    if a.ref_labels.is_some() && a.embeddings.is_some() && a.ref_embeddings.is_none() {
        return Err("with --ref-labels and --embeddings, --ref-embeddings is needed too".into());
    }
    let batch = Side::read(&a.labels, a.embeddings.as_deref())?;
    let refs = a
        .ref_labels
        .as_deref()
        .map(|l| Side::read(l, a.ref_embeddings.as_deref()))
        .transpose()?;
    let rule = match a.embeddings {
        None => TripletRule::AllValid,
        Some(_) => TripletRule::Margin {
            kind: match a.kind.unwrap_or(TypeArg::All) {
                TypeArg::All => TripletType::All,
                TypeArg::Hard => TripletType::Hard,
                TypeArg::Semihard => TripletType::Semihard,
                TypeArg::Easy => TripletType::Easy,
            },
            margin: a.margin.unwrap_or(0.2),
        },
    };
    let cfg = TripletConfig {
        rule,
        distance: distance_config(&a.metric, Distance::Euclidean),
        hooks: hooks.clone(),
        ..Default::default()
    };
    let ctx = context(&a.common)?;
    let inputs = given(&[
        ("labels", Some(&a.labels)),
        ("ref-labels", a.ref_labels.as_deref()),
        ("embeddings", a.embeddings.as_deref()),
        ("ref-embeddings", a.ref_embeddings.as_deref()),
    ]);
    let (queries, ref_set) = (batch.set(), refs.as_ref().map(Side::set));
    if a.count_only {
        let n = timed("triplets", &ctx, &a.common, &inputs, || {
            count_triplets(&ctx, &queries, ref_set.as_ref(), &cfg)
        })?;
        println!("{{\"count\": {}}}", n.count);
        return Ok(());
    }
    let t = timed("triplets", &ctx, &a.common, &inputs, || {
        mine_triplets(&ctx, &queries, ref_set.as_ref(), &cfg)
    })?;
    let out = a.out.as_deref().ok_or("--out is required")?;
    Ok(npy::write(out, &npy::indices(&t.indices))?)
}

pub(crate) fn mine(a: &MineArgs, hooks: &Hooks) -> Result<(), Failure> {
    let batch = Side::read(&a.labels, Some(&a.embeddings))?;
    let refs = match (&a.ref_labels, &a.ref_embeddings) {
        (Some(l), Some(e)) => Some(Side::read(l, Some(e))?),
        _ => None,
    };
    let ctx = context(&a.common)?;
    let inputs = given(&[
        ("labels", Some(&a.labels)),
        ("embeddings", Some(&a.embeddings)),
        ("ref-labels", a.ref_labels.as_deref()),
        ("ref-embeddings", a.ref_embeddings.as_deref()),
    ]);
    let (queries, ref_set) = (batch.set(), refs.as_ref().map(Side::set));
    let refs = ref_set.as_ref();
    let distance = |default| distance_config(&a.metric, default);
    // Without references each query is excluded as its own positive; with them, nothing.
    let exclusion = SelfExclusion::Auto;
    let strategy = |s: Option<StrategyArg>, default| match s {
        None => default,
        Some(StrategyArg::Hard) => Strategy::Hard,
        Some(StrategyArg::Semihard) => Strategy::Semihard,
        Some(StrategyArg::Easy) => Strategy::Easy,
        Some(StrategyArg::All) => Strategy::All,
    };
    let pairs: Pairs = match a.miner {
        MinerArg::BatchHard => {
            let cfg = BatchHardConfig {
                distance: distance(Distance::Euclidean),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            let t = timed("mine batch-hard", &ctx, &a.common, &inputs, || {
                batch_hard_triplets(&ctx, &queries, refs, &cfg)
            })?;
            let out = a.out.as_deref().ok_or("batch-hard writes --out")?;
            return Ok(npy::write(out, &npy::indices(&t.indices))?);
        }
        MinerArg::BatchEasyHard => {
            let defaults = BatchEasyHardConfig::default();
            let cfg = BatchEasyHardConfig {
                pos_strategy: strategy(a.pos_strategy, defaults.pos_strategy),
                neg_strategy: strategy(a.neg_strategy, defaults.neg_strategy),
                allowed_pos_range: a.allowed_pos_range,
                allowed_neg_range: a.allowed_neg_range,
                distance: distance(Distance::Euclidean),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            timed("mine batch-easy-hard", &ctx, &a.common, &inputs, || {
                batch_easy_hard_pairs(&ctx, &queries, refs, &cfg)
            })?
        }
        MinerArg::MultiSimilarity => {
            let cfg = MultiSimilarityConfig {
                epsilon: a
                    .epsilon
                    .unwrap_or(MultiSimilarityConfig::default().epsilon),
                distance: distance(Distance::Cosine),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            timed("mine multi-similarity", &ctx, &a.common, &inputs, || {
                multi_similarity_pairs(&ctx, &queries, refs, &cfg)
            })?
        }
        MinerArg::PairMargin => {
            let defaults = PairMarginConfig::default();
            let cfg = PairMarginConfig {
                pos_margin: a.pos_margin.unwrap_or(defaults.pos_margin),
                neg_margin: a.neg_margin.unwrap_or(defaults.neg_margin),
                distance: distance(Distance::Euclidean),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            timed("mine pair-margin", &ctx, &a.common, &inputs, || {
                pair_margin_pairs(&ctx, &queries, refs, &cfg)
            })?
        }
        MinerArg::Angular => {
            euclidean_only("angular", &a.metric)?;
            let cfg = AngularConfig {
                angle: a.angle.unwrap_or(AngularConfig::default().angle),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            let t = timed("mine angular", &ctx, &a.common, &inputs, || {
                angular_triplets(&ctx, &queries, refs, &cfg)
            })?;
            let out = a.out.as_deref().ok_or("angular writes --out")?;
            return Ok(npy::write(out, &npy::indices(&t.indices))?);
        }
        MinerArg::DistanceWeighted => {
            euclidean_only("distance-weighted", &a.metric)?;
            let defaults = DistanceWeightedConfig::default();
            let cfg = DistanceWeightedConfig {
                cutoff: a.cutoff.unwrap_or(defaults.cutoff),
                nonzero_loss_cutoff: a
                    .nonzero_loss_cutoff
                    .unwrap_or(defaults.nonzero_loss_cutoff),
                seed: a.seed.unwrap_or(defaults.seed),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            let t = timed("mine distance-weighted", &ctx, &a.common, &inputs, || {
                distance_weighted_triplets(&ctx, &queries, refs, &cfg)
            })?;
            let out = a.out.as_deref().ok_or("distance-weighted writes --out")?;
            return Ok(npy::write(out, &npy::indices(&t.indices))?);
        }
        MinerArg::Hdc => {
            let cfg = HdcConfig {
                filter_percentage: a
                    .filter_percentage
                    .unwrap_or(HdcConfig::default().filter_percentage),
                distance: distance(Distance::Euclidean),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            timed("mine hdc", &ctx, &a.common, &inputs, || {
                hdc_pairs(&ctx, &queries, refs, &cfg)
            })?
        }
        MinerArg::UniformHistogram => {
            let defaults = UniformHistogramConfig::default();
            let cfg = UniformHistogramConfig {
                num_bins: a.num_bins.unwrap_or(defaults.num_bins),
                pos_per_bin: a.pos_per_bin.unwrap_or(defaults.pos_per_bin),
                neg_per_bin: a.neg_per_bin.unwrap_or(defaults.neg_per_bin),
                distance: distance(Distance::Euclidean),
                seed: a.seed.unwrap_or(defaults.seed),
                self_exclusion: exclusion,
                hooks: hooks.clone(),
            };
            timed("mine uniform-histogram", &ctx, &a.common, &inputs, || {
                uniform_histogram_pairs(&ctx, &queries, refs, &cfg)
            })?
        }
    };
    let (Some(pos), Some(neg)) = (a.out_positives.as_deref(), a.out_negatives.as_deref()) else {
        return Err("pair miners write --out-positives and --out-negatives".into());
    };
    npy::write(pos, &npy::indices(&pairs.positives))?;
    Ok(npy::write(neg, &npy::indices(&pairs.negatives))?)
}

/// The miners whose distance PML fixes (Euclidean; angular measures raw embeddings,
/// distance-weighted normalised ones) take no distance flags.
fn euclidean_only(miner: &str, metric: &Metric) -> Result<(), Failure> {
    if metric.distance.is_some() || metric.no_normalize {
        return Err(format!(
            "{miner} has PML's fixed distance: drop --distance and --no-normalize"
        )
        .into());
    }
    Ok(())
}

pub(crate) fn knn(a: &KnnArgs, hooks: &Hooks) -> Result<(), Failure> {
    let queries = npy::read_embeddings(&a.queries)?;
    let refs = a.refs.as_deref().map(npy::read_embeddings).transpose()?;
    let cfg = knn_config(a, hooks);
    let ctx = context(&a.common)?;
    let inputs = given(&[("queries", Some(&a.queries)), ("refs", a.refs.as_deref())]);
    let r = refs.as_ref().unwrap_or(&queries);
    let found = timed("knn", &ctx, &a.common, &inputs, || {
        knn_op(&ctx, queries.view(), r.view(), &cfg)
    })?;
    npy::write(&a.out_indices, &npy::indices(&found.indices))?;
    Ok(npy::write(&a.out_scores, &found.scores)?)
}

/// The search `wml knn` asks for: without --refs the queries are the references, each
/// excluding itself.
pub(crate) fn knn_config(a: &KnnArgs, hooks: &Hooks) -> KnnConfig {
    KnnConfig {
        k: a.k,
        distance: distance_config(&a.metric, Distance::Euclidean),
        self_exclusion: match a.refs {
            None => SelfExclusion::SameIndex,
            Some(_) => SelfExclusion::None,
        },
        hooks: hooks.clone(),
    }
}

pub(crate) fn accuracy(a: &AccuracyArgs, hooks: &Hooks) -> Result<(), Failure> {
    let x = npy::read_embeddings(&a.embeddings)?;
    let y = npy::read_labels(&a.labels)?;
    let refs = match (&a.refs, &a.ref_labels) {
        (Some(r), Some(l)) => Some((npy::read_embeddings(r)?, npy::read_labels(l)?)),
        _ => None,
    };
    let cfg = accuracy_config(a, hooks)?;
    let ctx = context(&a.common)?;
    let inputs = accuracy_inputs(a);
    let r = refs.as_ref().map(|(e, l)| MiningSet::new(e, l));
    let acc = timed("accuracy", &ctx, &a.common, &inputs, || {
        accuracy_op(&ctx, &MiningSet::new(&x, &y), r.as_ref(), &cfg)
    })?;
    print_accuracy(&acc, &cfg);
    Ok(())
}

/// The input files of `wml accuracy`, for messages.
pub(crate) fn accuracy_inputs(a: &AccuracyArgs) -> Vec<(&str, &Path)> {
    given(&[
        ("embeddings", Some(&a.embeddings)),
        ("labels", Some(&a.labels)),
        ("refs", a.refs.as_deref()),
        ("ref-labels", a.ref_labels.as_deref()),
    ])
}

/// The metrics `wml accuracy` asks for.
pub(crate) fn accuracy_config(a: &AccuracyArgs, hooks: &Hooks) -> Result<AccuracyConfig, Failure> {
    if a.ref_includes_query && a.refs.is_none() {
        return Err(problem(
            &a.embeddings,
            "--ref-includes-query needs --refs and --ref-labels (without them it is implied)",
        )
        .into());
    }
    Ok(AccuracyConfig {
        k: a.k,
        distance: distance_config(&a.metric, Distance::SquaredEuclidean),
        self_exclusion: match a.ref_includes_query {
            true => SelfExclusion::SameIndex,
            false => SelfExclusion::Auto,
        },
        avg_of_avgs: a.avg_of_avgs,
        include: match a.include.is_empty() {
            true => AccuracyMetric::KNN.to_vec(),
            false => a.include.clone(),
        },
        kmeans: KmeansConfig {
            seed: a.seed,
            max_iterations: a.kmeans_iterations,
            ..Default::default()
        },
        hooks: hooks.clone(),
    })
}

/// The metrics as one JSON object on stdout: PML's keys, in PML's order, for the included
/// metrics only, then `k` and `lone_queries`.
pub(crate) fn print_accuracy(acc: &Accuracy<i64>, cfg: &AccuracyConfig) {
    let m = &acc.metrics;
    let value = |metric: AccuracyMetric| match metric {
        AccuracyMetric::PrecisionAt1 => m.precision_at_1,
        AccuracyMetric::RPrecision => m.r_precision,
        AccuracyMetric::MeanAveragePrecisionAtR => m.mean_average_precision_at_r,
        AccuracyMetric::MeanAveragePrecision => m.mean_average_precision,
        AccuracyMetric::MeanReciprocalRank => m.mean_reciprocal_rank,
        AccuracyMetric::Nmi => acc.nmi.unwrap_or(f64::NAN),
        AccuracyMetric::Ami => acc.ami.unwrap_or(f64::NAN),
    };
    let fields: Vec<String> = AccuracyMetric::ALL
        .into_iter()
        .filter(|metric| cfg.include.contains(metric))
        .map(|metric| format!("\"{}\": {}", metric.name(), json_number(value(metric))))
        .collect();
    println!(
        "{{{}, \"k\": {}, \"lone_queries\": {}}}",
        fields.join(", "),
        acc.k,
        acc.lone_queries
    );
}

/// `wml tune`: each shape's bucket tuned on the device, the winners cached, the table printed.
pub(crate) fn tune(a: &crate::TuneOptions) -> Result<(), Failure> {
    let ctx = context(&a.common)?;
    let mut shapes = Vec::new();
    for s in a.shapes.split(',').filter(|s| !s.trim().is_empty()) {
        let dims: Vec<usize> = s
            .trim()
            .split('x')
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(|_| Failure::Message(format!("--shapes: {s:?} is not ROWSxCOLSxD")))?;
        match dims.as_slice() {
            &[r, c, d] if r > 0 && c > 0 && d > 0 => shapes.push((r, c, d)),
            _ => {
                return Err(Failure::Message(format!(
                    "--shapes: {s:?} is not ROWSxCOLSxD"
                )))
            }
        }
    }
    if !a.json {
        println!("tuning the distance GEMM on {}", ctx.device_name());
    }
    for (rows, cols, d) in shapes {
        let r = ctx.tune_distance(rows, cols, d, a.cached).map_err(|e| {
            Failure::Message(format!("tune {rows}x{cols}x{d}: {}", with_causes(&e)))
        })?;
        let (tr, tc, td) = r.tile;
        let gflops = |s: f64| 2.0 * (tr * tc * td) as f64 / s * 1e-9;
        let winner = r.chosen.map_or("hand-written".to_string(), |v| v.name());
        if a.json {
            let cands: Vec<String> = r
                .candidates
                .iter()
                .map(|(v, s)| format!("{{\"variant\": \"{}\", \"seconds\": {s:e}}}", v.name()))
                .collect();
            println!(
                "{{\"shape\": \"{rows}x{cols}x{d}\", \"bucket\": \"{}\", \"winner\": \"{winner}\", \"tile\": [{tr}, {tc}, {td}], \"by_timestamps\": {}, \"from_cache\": {}, \"tune_seconds\": {:.3}, \"candidates\": [{}]}}",
                r.bucket,
                r.by_timestamps,
                r.from_cache,
                r.seconds,
                cands.join(", ")
            );
            continue;
        }
        println!(
            "\n{rows}x{cols}x{d} (bucket {}, tile {tr}x{tc}x{td}, {}{}, {:.2} s)",
            r.bucket,
            if r.by_timestamps {
                "timestamps"
            } else {
                "wall clock"
            },
            if r.from_cache { ", from the cache" } else { "" },
            r.seconds
        );
        for (v, s) in &r.candidates {
            let mark = if Some(*v) == r.chosen {
                "  <- winner"
            } else {
                ""
            };
            if r.from_cache {
                println!("  {:<20} {:>9.3} ms{mark}", v.name(), s * 1e3);
            } else {
                println!(
                    "  {:<20} {:>9.3} ms {:>9.1} GFLOP/s{mark}",
                    v.name(),
                    s * 1e3,
                    gflops(*s)
                );
            }
        }
    }
    Ok(())
}

//! Times one triplet-mining case and prints one JSON line (the format of the PML anchor
//! workers in `shared/anchors/bench_pml.py`, so `benches/compare_pml.py` can put them side by
//! side).
//!
//! ```sh
//! cargo run --release --example bench_mining -- --path wgpu --func miner_semihard --B 21 --M 10000 --C 100
//! ```
//! `--func`: `lmu` (every valid triplet, as arrays), `lmu_count` (count only), `lmu_stream`
//! (streamed in chunks, nothing kept), `miner_<all|hard|semihard|easy>` (TripletMarginMiner,
//! margin 0.2, normalised Euclidean) and `miner_<type>_count`. `--path wgpu|cpu`,
//! `--budget-mib` (default 64), `--reps` (default 5, after one warm-up), `--count-method
//! auto|scan|sorted` (default auto), `--output host|device` (default host; `device`: the
//! triplets left on the device by `mine_triplets_on_device`, wgpu only). The pair miners with
//! PML's defaults: `pairs_all`, `pairs_margin`, `pairs_multi` (multi-similarity),
//! `pairs_easy_hard`; `count` is positive and negative pairs together, and `--output device`
//! leaves them on the device (`mine_on_device`).
//! The triplet loss with its gradient (`triplet_margin_loss`, PML's `TripletMarginLoss`,
//! margin 0.05, against the references without their gradient): `loss_triplet_all` (every
//! valid triplet), `loss_triplet_<hard|semihard>` (fused with TripletMarginMiner, margin 0.2);
//! `count` is the triplets with a positive loss. `loss_ntxent` (PML's `NTXentLoss()` on two
//! noisy views of `B/2` items) and `loss_mnrl` (sentence-transformers' MNRL, `B` anchors
//! against their noisy positives), `--D` dimensions (default 768); `count` is the positive
//! pairs. `--matryoshka 768,512,256,128,64` adds sentence-transformers' `MatryoshkaLoss`
//! widths to either (one pass over every width); with `--ab`, the plain call and the
//! Matryoshka call alternate in one process and an `AB` line gives their ratio.
//! PML's pair losses with their gradient (`pair_loss`, each loss's defaults and default
//! distance): `loss_pair_<contrastive|multi_similarity|supcon|circle|nca|generalized_lifted|
//! margin|fast_ap|tcm|ranked_list|intra_pair_variance|lifted|histogram|snr_contrastive|
//! tuplet_margin|n_pairs|instance>`, the `B` queries against `M` references without
//! their gradient, or among themselves with `--M 0` (Lifted and Histogram run on the device
//! only so; PML's FastAP and Histogram take no references); `count` is the reducers' divisors.
//! `--kernel-timing`: every kernel timed by timestamps, its GPU seconds per operation in
//! the line's `kernels`.
//! Inputs follow the anchors: labels uniform over C classes, embeddings N(0, 1) in 128-d,
//! normalised, from a fixed seed (a different generator than torch's, so counts differ by
//! sampling noise only).

mod support;

use std::ops::ControlFlow;
use std::time::Instant;

use ndarray::{Array1, Array2};
use support::{embeddings, flag, kernel_timing_flag, peak_rss_mib, summary, traffic, Rng};
use wgpu_metric_learning::{
    all_pairs, batch_easy_hard_pairs, count_triplets, mine_on_device, mine_triplets,
    mine_triplets_on_device, mine_triplets_streaming, multi_similarity_pairs,
    multiple_negatives_ranking_loss, ntxent_loss, pair_loss, pair_margin_pairs,
    triplet_margin_loss, AllPairsConfig, BackendChoice, BatchEasyHardConfig, Circle, ComputePath,
    Context, ContextConfig, Contrastive, CountMethod, FastAp, GeneralizedLifted, Histogram,
    InfoNceConfig, Instance, IntraPairVariance, LiftedStructure, Margin, Matryoshka, MiningSet,
    MnrlConfig, MultiSimilarity, MultiSimilarityConfig, NPairs, Nca, PairLoss, PairLossConfig,
    PairLossRule, PairMarginConfig, Pairs, PairsOnDevice, RankedList, SnrContrastive, SupCon,
    ThresholdConsistentMargin, TripletConfig, TripletLossConfig, TripletRule, TripletType,
    TupletMargin,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let get = flag;
    let (b, m, c): (usize, usize, u64) = (
        get("--B", "21").parse()?,
        get("--M", "10000").parse()?,
        get("--C", "100").parse()?,
    );
    let func = get("--func", "lmu");
    let reps: usize = get("--reps", "5").parse()?;
    let budget: u64 = get("--budget-mib", "64").parse::<u64>()? << 20;
    let backend = match get("--path", "wgpu").as_str() {
        "cpu" => BackendChoice::NativeCpu,
        _ => BackendChoice::Wgpu,
    };
    let ctx = Context::new(&ContextConfig {
        backend,
        budget_bytes: Some(budget),
        kernel_timing: kernel_timing_flag(),
        ..Default::default()
    })?;

    let mut rng = Rng(0x5EED);
    let labels = Array1::from_shape_simple_fn(b, || (rng.next() % c) as i64);
    let ref_labels = Array1::from_shape_simple_fn(m, || (rng.next() % c) as i64);
    let (emb, ref_emb) = (embeddings(&mut rng, b, 128), embeddings(&mut rng, m, 128));
    // Raw N(0, 1) rows (not normalised), for the InfoNCE data.
    let mut raw = Rng(0xC0FFEE);
    let mut embeddings_raw =
        |n: usize, d: usize| Array2::from_shape_simple_fn((n, d), || raw.normal());
    let queries = MiningSet::new(&emb, &labels);
    let refs = MiningSet::new(&ref_emb, &ref_labels);

    let on_device = get("--output", "host") == "device";
    if let Some(pairs) = func.strip_prefix("pairs_") {
        let run = || -> Result<u64, wgpu_metric_learning::Error> {
            let r = Some(&refs);
            let host = |p: Pairs| (p.positives.nrows() + p.negatives.nrows()) as u64;
            let device = |p: PairsOnDevice| (p.positives.dim().0 + p.negatives.dim().0) as u64;
            match (pairs, on_device) {
                ("all", false) => all_pairs(&ctx, &queries, r, &Default::default()).map(host),
                ("all", true) => {
                    mine_on_device(&ctx, &queries, r, &AllPairsConfig::default()).map(device)
                }
                ("margin", false) => {
                    pair_margin_pairs(&ctx, &queries, r, &Default::default()).map(host)
                }
                ("margin", true) => {
                    mine_on_device(&ctx, &queries, r, &PairMarginConfig::default()).map(device)
                }
                ("multi", false) => {
                    multi_similarity_pairs(&ctx, &queries, r, &Default::default()).map(host)
                }
                ("multi", true) => {
                    mine_on_device(&ctx, &queries, r, &MultiSimilarityConfig::default()).map(device)
                }
                ("easy_hard", false) => {
                    batch_easy_hard_pairs(&ctx, &queries, r, &Default::default()).map(host)
                }
                ("easy_hard", true) => {
                    mine_on_device(&ctx, &queries, r, &BatchEasyHardConfig::default()).map(device)
                }
                (other, _) => Err(wgpu_metric_learning::Error::InvalidParameter {
                    op: "bench_mining",
                    what: "--func",
                    value: format!("pairs_{other}"),
                    rule: "pairs_all|pairs_margin|pairs_multi|pairs_easy_hard",
                }),
            }
        };
        return measure(&ctx, (&func, b, m, c), (budget, reps, on_device), run);
    }
    if func == "loss_ntxent" || func == "loss_mnrl" {
        // NTXent on two noisy views of B/2 items, MNRL on B anchors against their noisy
        // positives (the data of benches/compare_losses.py, from this file's generator), in
        // `--D` dimensions; `count` is the positive pairs.
        let d: usize = get("--D", "768").parse()?;
        let mut noisy = |x: &Array2<f32>| x.mapv(|v| v + 1.5 * rng.normal());
        let items = embeddings_raw(b / 2, d);
        let views = ndarray::concatenate![ndarray::Axis(0), noisy(&items), noisy(&items)];
        let view_labels = Array1::from_shape_fn(views.nrows(), |i| (i % (b / 2).max(1)) as i64);
        let anchors = embeddings_raw(b, d);
        let positives = noisy(&anchors);
        let widths = get("--matryoshka", "");
        let matryoshka = match widths.is_empty() {
            true => None,
            false => Some(Matryoshka::new(
                widths
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<Vec<usize>, _>>()?,
            )),
        };
        let call = |matryoshka: Option<Matryoshka>| {
            let out = if func == "loss_ntxent" {
                let set = MiningSet::new(&views, &view_labels);
                let cfg = InfoNceConfig {
                    matryoshka,
                    ..Default::default()
                };
                ntxent_loss(&ctx, &set, None, &cfg)?
            } else {
                let cfg = MnrlConfig {
                    matryoshka,
                    ..Default::default()
                };
                multiple_negatives_ranking_loss(&ctx, &anchors, &positives, &cfg)?
            };
            on_path(&ctx, out.path).map(|()| out.positive_pairs)
        };
        if std::env::args().any(|a| a == "--ab") && matryoshka.is_some() {
            return matryoshka_ab(reps, || call(None), || call(matryoshka.clone()));
        }
        let run = || call(matryoshka.clone());
        return measure(&ctx, (&func, b, m, c), (budget, reps, on_device), run);
    }
    if let Some(name) = func.strip_prefix("loss_pair_") {
        let against = (m > 0).then_some(&refs);
        let run = || {
            let out = pair_case(&ctx, name, &queries, against)?;
            on_path(&ctx, out.path).map(|()| out.nonzero)
        };
        return measure(&ctx, (&func, b, m, c), (budget, reps, on_device), run);
    }
    if let Some(kind) = func.strip_prefix("loss_triplet_") {
        // PML's TripletMarginLoss (margin 0.05) over every valid triplet or those its
        // TripletMarginMiner (margin 0.2) keeps, against the references (a bank's rows:
        // no reference gradient); `count` is the triplets with a positive loss.
        let triplets = match kind {
            "all" => TripletRule::AllValid,
            "hard" => TripletRule::margin_miner(TripletType::Hard),
            "semihard" => TripletRule::margin_miner(TripletType::Semihard),
            other => return Err(format!("unknown --func loss_triplet_{other}").into()),
        };
        let cfg = TripletLossConfig {
            triplets,
            ..Default::default()
        };
        let run = || {
            let out = triplet_margin_loss(&ctx, &queries, Some(&refs), &cfg)?;
            on_path(&ctx, out.path).map(|()| out.nonzero)
        };
        return measure(&ctx, (&func, b, m, c), (budget, reps, on_device), run);
    }
    let base = func.trim_end_matches("_count").trim_end_matches("_stream");
    let rule = match base {
        "lmu" => TripletRule::AllValid,
        "miner_all" => TripletRule::margin_miner(TripletType::All),
        "miner_hard" => TripletRule::margin_miner(TripletType::Hard),
        "miner_semihard" => TripletRule::margin_miner(TripletType::Semihard),
        "miner_easy" => TripletRule::margin_miner(TripletType::Easy),
        other => return Err(format!("unknown --func {other}").into()),
    };
    let count_method = match get("--count-method", "auto").as_str() {
        "scan" => CountMethod::Scan,
        "sorted" => CountMethod::Sorted,
        _ => CountMethod::Auto,
    };
    let cfg = TripletConfig {
        rule,
        count_method,
        ..Default::default()
    };
    let run = || -> Result<u64, wgpu_metric_learning::Error> {
        if on_device {
            mine_triplets_on_device(&ctx, &queries, Some(&refs), &cfg).map(|t| t.len() as u64)
        } else if func.ends_with("_count") {
            count_triplets(&ctx, &queries, Some(&refs), &cfg).map(|n| n.count)
        } else if func.ends_with("_stream") {
            let mut seen = 0u64;
            mine_triplets_streaming(&ctx, &queries, Some(&refs), &cfg, |chunk| {
                seen += chunk.nrows() as u64;
                ControlFlow::Continue(())
            })?;
            Ok(seen)
        } else {
            mine_triplets(&ctx, &queries, Some(&refs), &cfg).map(|t| t.len() as u64)
        }
    };
    measure(&ctx, (&func, b, m, c), (budget, reps, on_device), run)
}

/// An error unless a loss ran on the context's path (a device path that fell back to the
/// native one would be reported under the wrong path).
/// `pair_loss` with the rule `name` names and its defaults.
fn pair_case(
    ctx: &Context,
    name: &str,
    queries: &MiningSet<'_, i64>,
    refs: Option<&MiningSet<'_, i64>>,
) -> Result<PairLoss, wgpu_metric_learning::Error> {
    fn with<R: PairLossRule>(
        ctx: &Context,
        (queries, refs): (&MiningSet<'_, i64>, Option<&MiningSet<'_, i64>>),
    ) -> Result<PairLoss, wgpu_metric_learning::Error> {
        pair_loss(ctx, queries, refs, &PairLossConfig::<R>::default())
    }
    let sides = (queries, refs);
    match name {
        "contrastive" => with::<Contrastive>(ctx, sides),
        "multi_similarity" => with::<MultiSimilarity>(ctx, sides),
        "supcon" => with::<SupCon>(ctx, sides),
        "circle" => with::<Circle>(ctx, sides),
        "nca" => with::<Nca>(ctx, sides),
        "generalized_lifted" => with::<GeneralizedLifted>(ctx, sides),
        "margin" => with::<Margin>(ctx, sides),
        "fast_ap" => with::<FastAp>(ctx, sides),
        "tcm" => with::<ThresholdConsistentMargin>(ctx, sides),
        "lifted" => with::<LiftedStructure>(ctx, sides),
        "histogram" => with::<Histogram>(ctx, sides),
        "ranked_list" => with::<RankedList>(ctx, sides),
        "intra_pair_variance" => with::<IntraPairVariance>(ctx, sides),
        "snr_contrastive" => with::<SnrContrastive>(ctx, sides),
        "tuplet_margin" => with::<TupletMargin>(ctx, sides),
        "n_pairs" => with::<NPairs>(ctx, sides),
        "instance" => with::<Instance>(ctx, sides),
        other => Err(wgpu_metric_learning::Error::InvalidParameter {
            op: "bench_mining",
            what: "--func",
            value: format!("loss_pair_{other}"),
            rule: "a pair loss this bench knows",
        }),
    }
}

fn on_path(ctx: &Context, path: ComputePath) -> Result<(), wgpu_metric_learning::Error> {
    if path == ctx.path() {
        return Ok(());
    }
    Err(wgpu_metric_learning::Error::InvalidParameter {
        op: "bench_mining",
        what: "--path",
        value: format!("{path:?}"),
        rule: "the loss must run on the context's path (it fell back)",
    })
}

/// Times `run` `reps` times after a warm-up and prints the RESULT line.
/// `--ab`: the plain call and the Matryoshka call in turn, `reps` pairs after a warm-up of
/// each, in one process (so that a noisy machine slows both alike); prints one `AB` line
/// with each one's median and least, and the median of the pairs' ratios.
fn matryoshka_ab(
    reps: usize,
    plain: impl Fn() -> Result<u64, wgpu_metric_learning::Error>,
    widths: impl Fn() -> Result<u64, wgpu_metric_learning::Error>,
) -> Result<(), Box<dyn std::error::Error>> {
    plain()?;
    widths()?;
    let (mut p, mut w, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        plain()?;
        p.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        widths()?;
        w.push(t.elapsed().as_secs_f64());
        ratios.push(w[w.len() - 1] / p[p.len() - 1]);
    }
    let ((pm, pl, _), (wm, wl, _)) = (summary(&mut p), summary(&mut w));
    let (ratio, _, _) = summary(&mut ratios);
    println!(
        "AB {{\"plain_median_s\": {pm:.4}, \"plain_min_s\": {pl:.4}, \"matryoshka_median_s\": {wm:.4}, \"matryoshka_min_s\": {wl:.4}, \"ratio_of_mins\": {:.3}, \"median_pair_ratio\": {ratio:.3}}}",
        wl / pl
    );
    Ok(())
}

fn measure(
    ctx: &Context,
    (func, b, m, c): (&str, usize, usize, u64),
    (budget, reps, on_device): (u64, usize, bool),
    run: impl Fn() -> Result<u64, wgpu_metric_learning::Error>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut count = run()?; // warm-up: compiles pipelines
    ctx.reset_peak();
    let before = ctx.transfers();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        count = run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    let moved = traffic(ctx, before, reps);
    let (median, min, max) = summary(&mut times);
    let mem = ctx.memory();
    println!(
        "RESULT {{\"impl\": \"wml\", \"path\": \"{}\", \"device\": \"{}\", \"func\": \"{func}\", \"output\": \"{}\", \"B\": {b}, \"M\": {m}, \"C\": {c}, \"count\": {count}, \"median_s\": {:.4}, \"min_s\": {:.4}, \"max_s\": {:.4}, {moved}, \"peak_device_mib\": {:.1}, \"budget_mib\": {}, \"peak_rss_mb\": {:.1}}}",
        match ctx.path() { ComputePath::NativeCpu => "cpu", _ => "wgpu" },
        ctx.device_name(),
        if on_device { "device" } else { "host" },
        median,
        min,
        max,
        mem.peak_bytes as f64 / (1 << 20) as f64,
        budget >> 20,
        peak_rss_mib()
    );
    Ok(())
}

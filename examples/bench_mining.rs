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
//! `--budget-mib` (default 64), `--reps` (default 5, after one warm-up).
//! Inputs follow the anchors: labels uniform over C classes, embeddings N(0, 1) in 128-d,
//! normalised, from a fixed seed (a different generator than torch's, so counts differ by
//! sampling noise only).

use std::ops::ControlFlow;
use std::time::Instant;

use ndarray::{Array1, Array2};
use wgpu_metric_learning::{
    count_triplets, mine_triplets, mine_triplets_streaming, BackendChoice, Context, ContextConfig,
    MiningSet, TripletConfig, TripletRule, TripletType,
};

/// A small deterministic generator (SplitMix64), enough for benchmark inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.uniform().max(1e-300), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
}

fn embeddings(rng: &mut Rng, rows: usize, d: usize) -> Array2<f32> {
    let mut x = Array2::from_shape_simple_fn((rows, d), || rng.normal());
    for mut row in x.rows_mut() {
        let n = row.dot(&row).sqrt().max(1e-12);
        row /= n;
    }
    x
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str, default: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
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
        ..Default::default()
    })?;

    let mut rng = Rng(0x5EED);
    let labels = Array1::from_shape_simple_fn(b, || (rng.next() % c) as i64);
    let ref_labels = Array1::from_shape_simple_fn(m, || (rng.next() % c) as i64);
    let (emb, ref_emb) = (embeddings(&mut rng, b, 128), embeddings(&mut rng, m, 128));
    let queries = MiningSet::with_embeddings(labels.view(), emb.view());
    let refs = MiningSet::with_embeddings(ref_labels.view(), ref_emb.view());

    let base = func.trim_end_matches("_count").trim_end_matches("_stream");
    let rule = match base {
        "lmu" => TripletRule::AllValid,
        "miner_all" => TripletRule::margin_miner(TripletType::All),
        "miner_hard" => TripletRule::margin_miner(TripletType::Hard),
        "miner_semihard" => TripletRule::margin_miner(TripletType::Semihard),
        "miner_easy" => TripletRule::margin_miner(TripletType::Easy),
        other => return Err(format!("unknown --func {other}").into()),
    };
    let cfg = TripletConfig {
        rule,
        ..Default::default()
    };
    let run = || -> Result<u64, wgpu_metric_learning::Error> {
        if func.ends_with("_count") {
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
    let mut count = run()?; // warm-up: compiles pipelines
    ctx.reset_peak();
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        count = run()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let mem = ctx.memory();
    println!(
        "RESULT {{\"impl\": \"wml\", \"path\": \"{}\", \"device\": \"{}\", \"func\": \"{func}\", \"B\": {b}, \"M\": {m}, \"C\": {c}, \"count\": {count}, \"median_s\": {:.4}, \"min_s\": {:.4}, \"max_s\": {:.4}, \"peak_device_mib\": {:.1}, \"budget_mib\": {}, \"peak_rss_mb\": {:.1}}}",
        match backend { BackendChoice::NativeCpu => "cpu", _ => "wgpu" },
        ctx.device_name(),
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        mem.peak_bytes as f64 / (1 << 20) as f64,
        budget >> 20,
        peak_rss_mib()
    );
    Ok(())
}

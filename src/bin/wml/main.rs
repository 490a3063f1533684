//! `wml`: the library from the command line, on `.npy` files, for numpy and PyTorch users.
//! `wml --help` lists the subcommands; `wml <subcommand> --help` their options.

mod classifier;
mod commands;
#[cfg(feature = "mpi")]
mod distributed;
mod loss_args;
mod losses;
mod npy;
mod weights;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub(crate) use self::TuneArgs as TuneOptions;
use wgpu_metric_learning::{CancelToken, Hooks, Progress};

use loss_args::LossCommand;
use weights::WeightsCommand;

/// The GPU core of metric learning on .npy files: triplet mining, PML's miners, kNN and
/// retrieval accuracy, losses with their gradients, on any GPU through wgpu or on the native
/// CPU path.
///
/// Inputs: embeddings are float32 or float64 .npy arrays of shape (n, d); labels are int32,
/// int64 or uint32 arrays of shape (n,). Outputs: indices are int64, scores float32. As in
/// PML, embeddings are L2-normalised by default for every distance; --no-normalize uses the
/// raw vectors (Faiss's convention). Errors print one line naming the file and the problem
/// and exit with status 1 (2 for a malformed command line); Ctrl-C stops the operation at its
/// next chunk, writes nothing and exits with status 130.
#[derive(Parser)]
#[command(name = "wml", version, about, long_about, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Triplets (a, p, n) in PML's lexicographic order: every valid one from labels alone
    /// (PML get_all_triplets_indices), or TripletMarginMiner's with --embeddings. Writes
    /// --out as an (n, 3) int64 array, or with --count-only prints {"count": n}.
    Triplets(TripletsArgs),
    /// PML's other miners. The triplet miners (batch-hard, angular, distance-weighted)
    /// write --out, an (n, 3) int64 array of (anchor, positive, negative); the pair miners
    /// (batch-easy-hard, multi-similarity, pair-margin, hdc, uniform-histogram) write
    /// --out-positives and --out-negatives, (n, 2) int64 arrays of (anchor, positive) and
    /// (anchor, negative) pairs. distance-weighted and uniform-histogram draw at random: their
    /// output is a function of the inputs and --seed.
    Mine(MineArgs),
    /// The k nearest references of every query: --out-indices (q, k) int64 and --out-scores
    /// (q, k) float32, best first, ties to the lower index. Without --refs the queries are
    /// the references and each query's own index is excluded (PML ref_includes_query).
    Knn(KnnArgs),
    /// PML AccuracyCalculator's metrics (precision_at_1, r_precision,
    /// mean_average_precision_at_r, mean_average_precision, mean_reciprocal_rank) as one JSON
    /// object on stdout. Without --refs the embeddings are their own references, each query
    /// excluding itself.
    Accuracy(AccuracyArgs),
    /// A loss and its gradient, with no triplet list and no full similarity matrix: PML's
    /// TripletMarginLoss and NTXentLoss, sentence-transformers' MultipleNegativesRankingLoss.
    /// Prints the loss and its counts as one JSON object on stdout and writes the gradients
    /// as float32 .npy arrays of the inputs' shapes.
    #[command(subcommand)]
    Loss(LossCommand),
    /// Tunes the distance GEMM on this machine's GPU ahead of time: times every kernel variant
    /// on each --shapes bucket, keeps the winners in the tuning cache (later runs reuse them)
    /// and prints the table: per shape, each variant's median milliseconds and TFLOP/s on its
    /// tile, the winner marked. --json prints one JSON object per shape instead.
    Tune(TuneArgs),
    /// The class weights of `wml loss arcface|cosface|…` across runs: an optimizer step
    /// (torch's SGD or AdamW) into a checkpoint, and a checkpoint's whole weights as one .npy.
    #[command(subcommand)]
    Weights(WeightsCommand),
}

#[derive(Args)]
struct TuneArgs {
    /// Comma-separated shapes ROWSxCOLSxD (queries x references x dimension); each is tuned
    /// for its bucket (powers of two; rows up to 4096, columns up to 65536).
    #[arg(
        long,
        default_value = "1024x4096x128,2048x16384x128,4096x65536x128,4096x4096x768"
    )]
    shapes: String,
    /// Take a cached winner as it is instead of timing again.
    #[arg(long)]
    cached: bool,
    /// One JSON object per shape on stdout instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: Common,
}

/// Options every subcommand takes.
#[derive(Args)]
struct Common {
    /// What runs the operation: auto picks a hardware GPU through wgpu, else the native CPU
    /// path (software rasterisers are ~10x slower than it); wgpu forces wgpu on the best
    /// adapter of any backend (a software one too; WGPU_BACKEND narrows it); vulkan, metal,
    /// dx12 and gl force wgpu on that backend; cpu forces the native CPU path.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    backend: BackendArg,
    /// Memory budget of the operation (device buffers, or the native path's scratch), in
    /// bytes or with a unit: 512MiB, 2GiB, 64KiB. Default: the library's (half the GPU's
    /// memory where the driver reports it).
    #[arg(long, value_parser = parse_bytes)]
    budget: Option<u64>,
    /// Print one JSON line on stderr: the operation's own seconds (no process start or file
    /// I/O), peak device bytes, the budget, the host's blocking waits for the device, its
    /// submissions, the bytes moved each way, the adapter, the path that ran
    /// and the native loops' vector set (`native_isa`).
    #[arg(long)]
    stats: bool,
    /// Print the operation's progress on stderr, one line per whole percent:
    /// `wml: 37% (pairs done of total)`.
    #[arg(long)]
    progress: bool,
}

impl Command {
    fn common(&self) -> &Common {
        match self {
            Command::Triplets(a) => &a.common,
            Command::Mine(a) => &a.common,
            Command::Knn(a) => &a.common,
            Command::Accuracy(a) => &a.common,
            Command::Loss(LossCommand::TripletMargin(a)) => &a.common,
            Command::Loss(LossCommand::Ntxent(a)) => &a.common,
            Command::Loss(LossCommand::Mnrl(a)) => &a.common,
            Command::Loss(LossCommand::Contrastive(a)) => &a.common,
            Command::Loss(LossCommand::MultiSimilarity(a)) => &a.common,
            Command::Loss(LossCommand::Supcon(a)) => &a.common,
            Command::Loss(LossCommand::Circle(a)) => &a.common,
            Command::Loss(LossCommand::Nca(a)) => &a.common,
            Command::Loss(LossCommand::GeneralizedLifted(a)) => &a.common,
            Command::Loss(LossCommand::Margin(a)) => &a.common,
            Command::Loss(LossCommand::FastAp(a)) => &a.common,
            Command::Loss(LossCommand::LiftedStructure(a)) => &a.common,
            Command::Loss(LossCommand::Histogram(a)) => &a.common,
            Command::Loss(LossCommand::TupletMargin(a)) => &a.common,
            Command::Loss(LossCommand::IntraPairVariance(a)) => &a.common,
            Command::Loss(LossCommand::RankedList(a)) => &a.common,
            Command::Loss(LossCommand::Tcm(a)) => &a.common,
            Command::Loss(LossCommand::Pnp(a)) => &a.common,
            Command::Loss(LossCommand::NPairs(a)) => &a.common,
            Command::Loss(LossCommand::Instance(a)) => &a.common,
            Command::Loss(LossCommand::Angular(a)) => &a.common,
            Command::Loss(LossCommand::Vicreg(a)) => &a.common,
            Command::Loss(LossCommand::SnrContrastive(a)) => &a.common,
            Command::Loss(LossCommand::DynamicSoftMargin(a)) => &a.common,
            Command::Loss(
                LossCommand::ArcFace(a)
                | LossCommand::SubCenterArcFace(a)
                | LossCommand::CosFace(a)
                | LossCommand::LargeMarginSoftmax(a)
                | LossCommand::SphereFace(a)
                | LossCommand::NormalizedSoftmax(a)
                | LossCommand::ProxyNca(a)
                | LossCommand::ProxyAnchor(a)
                | LossCommand::SoftTriple(a),
            ) => &a.common,
            Command::Tune(a) => &a.common,
            Command::Weights(WeightsCommand::Step(a)) => &a.common,
            Command::Weights(WeightsCommand::Export(a)) => &a.common,
        }
    }
}

/// The hooks every operation runs with: Ctrl-C cancels; `--progress` prints a line per whole
/// percent.
fn hooks(common: &Common) -> Hooks {
    let hooks = Hooks::new().cancel_with(&cancel_on_ctrl_c());
    if !common.progress {
        return hooks;
    }
    let shown = std::sync::Mutex::new(None);
    hooks.on_progress(move |p: Progress| {
        let percent = (100.0 * p.fraction()).floor() as u64;
        let mut last = shown.lock().unwrap_or_else(|e| e.into_inner());
        if *last != Some(percent) {
            *last = Some(percent);
            eprintln!("wml: {percent}% ({} of {})", p.done, p.total);
        }
    })
}

/// How embeddings are compared.
#[derive(Args)]
struct Metric {
    /// Distance or similarity. Default: euclidean (PML's LpDistance), cosine for
    /// multi-similarity, squared-euclidean for accuracy (Faiss IndexFlatL2's ranking).
    #[arg(long, value_enum)]
    distance: Option<DistanceArg>,
    /// Use the raw vectors instead of L2-normalised ones.
    #[arg(long)]
    no_normalize: bool,
}

#[derive(Args)]
struct TripletsArgs {
    /// Labels of the batch, (b,).
    #[arg(long)]
    labels: PathBuf,
    /// Labels of separate references, (m,); without it the references are the batch and a
    /// query is never its own positive.
    #[arg(long)]
    ref_labels: Option<PathBuf>,
    /// Embeddings of the batch, (b, d): turns on TripletMarginMiner.
    #[arg(long)]
    embeddings: Option<PathBuf>,
    /// Embeddings of the references, (m, d); needed with --ref-labels and --embeddings.
    #[arg(long)]
    ref_embeddings: Option<PathBuf>,
    /// TripletMarginMiner's type_of_triplets (needs --embeddings). Default all.
    #[arg(long = "type", value_enum)]
    kind: Option<TypeArg>,
    /// TripletMarginMiner's margin (needs --embeddings). Default 0.2.
    #[arg(long, allow_negative_numbers = true)]
    margin: Option<f32>,
    #[command(flatten)]
    metric: Metric,
    /// Only count the triplets; prints {"count": n} on stdout.
    #[arg(long)]
    count_only: bool,
    /// Output (n, 3) int64 array of (anchor, positive, negative).
    #[arg(long, required_unless_present = "count_only")]
    out: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct MineArgs {
    /// Which PML miner.
    #[arg(long, value_enum)]
    miner: MinerArg,
    /// Labels of the batch, (b,).
    #[arg(long)]
    labels: PathBuf,
    /// Embeddings of the batch, (b, d).
    #[arg(long)]
    embeddings: PathBuf,
    /// Labels of separate references, (m,) (with --ref-embeddings).
    #[arg(long, requires = "ref_embeddings")]
    ref_labels: Option<PathBuf>,
    /// Embeddings of separate references, (m, d) (with --ref-labels).
    #[arg(long, requires = "ref_labels")]
    ref_embeddings: Option<PathBuf>,
    #[command(flatten)]
    metric: Metric,
    /// batch-easy-hard: how positives are picked. Default easy.
    #[arg(long, value_enum)]
    pos_strategy: Option<StrategyArg>,
    /// batch-easy-hard: how negatives are picked. Default semihard.
    #[arg(long, value_enum)]
    neg_strategy: Option<StrategyArg>,
    /// batch-easy-hard: only positives with a value in LO,HI.
    #[arg(long, value_parser = parse_range, allow_hyphen_values = true)]
    allowed_pos_range: Option<(f32, f32)>,
    /// batch-easy-hard: only negatives with a value in LO,HI.
    #[arg(long, value_parser = parse_range, allow_hyphen_values = true)]
    allowed_neg_range: Option<(f32, f32)>,
    /// multi-similarity: epsilon. Default 0.1.
    #[arg(long)]
    epsilon: Option<f32>,
    /// pair-margin: pos_margin. Default 0.2.
    #[arg(long, allow_negative_numbers = true)]
    pos_margin: Option<f32>,
    /// pair-margin: neg_margin. Default 0.8.
    #[arg(long, allow_negative_numbers = true)]
    neg_margin: Option<f32>,
    /// angular: the angle in degrees above which triplets are kept. Default 20.
    #[arg(long, allow_negative_numbers = true)]
    angle: Option<f64>,
    /// hdc: the fraction of each side's pairs kept, in [0, 1]. Default 0.5.
    #[arg(long)]
    filter_percentage: Option<f64>,
    /// distance-weighted: distances below this count as this. Default 0.5.
    #[arg(long)]
    cutoff: Option<f32>,
    /// distance-weighted: negatives at this distance or farther are never drawn. Default 1.4.
    #[arg(long)]
    nonzero_loss_cutoff: Option<f32>,
    /// uniform-histogram: the number of equal-width bins of each side's values. Default 100.
    #[arg(long)]
    num_bins: Option<usize>,
    /// uniform-histogram: positive pairs drawn per non-empty bin. Default 10.
    #[arg(long)]
    pos_per_bin: Option<usize>,
    /// uniform-histogram: negative pairs drawn per non-empty bin. Default 10.
    #[arg(long)]
    neg_per_bin: Option<usize>,
    /// distance-weighted, uniform-histogram: the seed of the draws. Default 0.
    #[arg(long)]
    seed: Option<u64>,
    /// Triplet miners: output (n, 3) int64 array of (anchor, positive, negative).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Pair miners: output (n, 2) int64 array of (anchor, positive).
    #[arg(long)]
    out_positives: Option<PathBuf>,
    /// Pair miners: output (n, 2) int64 array of (anchor, negative).
    #[arg(long)]
    out_negatives: Option<PathBuf>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct KnnArgs {
    /// Queries, (q, d).
    #[arg(long)]
    queries: PathBuf,
    /// References, (n, d). Default: the queries, each excluding itself.
    #[arg(long)]
    refs: Option<PathBuf>,
    /// Neighbours per query, 1 ≤ k ≤ the references a query can see. No other limit.
    #[arg(short, long)]
    k: usize,
    #[command(flatten)]
    metric: Metric,
    /// Output (q, k) int64 array of reference indices.
    #[arg(long)]
    out_indices: PathBuf,
    /// Output (q, k) float32 array of distances (ascending) or similarities (descending).
    #[arg(long)]
    out_scores: PathBuf,
    #[command(flatten)]
    common: Common,
    #[cfg(feature = "mpi")]
    #[command(flatten)]
    distributed: DistributedArgs,
}

#[derive(Args)]
struct AccuracyArgs {
    /// Query embeddings, (q, d).
    #[arg(long)]
    embeddings: PathBuf,
    /// Query labels, (q,).
    #[arg(long)]
    labels: PathBuf,
    /// Reference embeddings, (n, d) (with --ref-labels).
    #[arg(long, requires = "ref_labels")]
    refs: Option<PathBuf>,
    /// Reference labels, (n,) (with --refs).
    #[arg(long, requires = "refs")]
    ref_labels: Option<PathBuf>,
    /// With --refs: reference i is query i (PML ref_includes_query).
    #[arg(long)]
    ref_includes_query: bool,
    /// Neighbours considered: all (PML's default), max_bin_count, or a number.
    #[arg(long, default_value = "all", value_parser = parse_accuracy_k)]
    k: wgpu_metric_learning::AccuracyK,
    #[command(flatten)]
    metric: Metric,
    /// Average per class first, then over classes.
    #[arg(long)]
    avg_of_avgs: bool,
    /// Metrics to compute, by PML's names, comma-separated: precision_at_1, r_precision,
    /// mean_average_precision_at_r, mean_average_precision, mean_reciprocal_rank, NMI, AMI.
    /// Default: the five kNN metrics. NMI and AMI cluster the queries with k-means.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    include: Vec<wgpu_metric_learning::AccuracyMetric>,
    /// Seed of the k-means behind NMI and AMI.
    #[arg(long, default_value_t = 1234)]
    seed: u64,
    /// Iterations of the k-means behind NMI and AMI (PML asks Faiss for 20).
    #[arg(long, default_value_t = 20)]
    kmeans_iterations: usize,
    #[command(flatten)]
    common: Common,
    #[cfg(feature = "mpi")]
    #[command(flatten)]
    distributed: DistributedArgs,
}

/// Running as one rank of an MPI job (a `wml` built with the `mpi` feature).
#[cfg(feature = "mpi")]
#[derive(Args)]
pub(crate) struct DistributedArgs {
    /// Run as one rank of an MPI job (`mpirun -np N wml ... --distributed`): each rank reads
    /// only its share of the input files' rows (contiguous, in rank order), the ranks search
    /// together, and rank 0 writes the outputs (knn) or prints the JSON (accuracy), the same
    /// as one process would. No rank reads or holds all the references.
    #[arg(long)]
    pub(crate) distributed: bool,
    /// With --distributed: the longest a rank waits for the others at a step, in seconds
    /// (their search of one query block included: lower --query-block for slow shards). A
    /// rank that gives up reports the step and ends the whole job (MPI cannot withdraw a
    /// collective it entered).
    #[arg(long, default_value_t = 600.0, requires = "distributed")]
    pub(crate) timeout: f64,
    /// With --distributed: queries sent to every rank at a time. Each block costs its owner
    /// about `block · (d + (8 + 4 · ranks) · k) · 4` bytes of host memory.
    #[arg(
        long,
        default_value_t = 2048,
        value_parser = clap::value_parser!(u64).range(1..),
        requires = "distributed"
    )]
    pub(crate) query_block: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    Wgpu,
    Vulkan,
    Metal,
    Dx12,
    Gl,
    Cpu,
}

#[derive(Clone, Copy, ValueEnum)]
enum DistanceArg {
    Euclidean,
    SquaredEuclidean,
    Cosine,
    Dot,
}

#[derive(Clone, Copy, ValueEnum)]
enum TypeArg {
    All,
    Hard,
    Semihard,
    Easy,
}

#[derive(Clone, Copy, ValueEnum)]
enum MinerArg {
    BatchHard,
    BatchEasyHard,
    MultiSimilarity,
    PairMargin,
    Angular,
    Hdc,
    DistanceWeighted,
    UniformHistogram,
}

#[derive(Clone, Copy, ValueEnum)]
enum StrategyArg {
    Hard,
    Semihard,
    Easy,
    All,
}

/// `123`, `64KiB`, `512MiB`, `2GiB` (also `K`/`M`/`G`, `KB`/`MB`/`GB` as binary units).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a byte count such as 512MiB"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(format!("unknown unit '{other}' (use KiB, MiB or GiB)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("'{s}' does not fit in 64 bits"))
}

/// `LO,HI` with `LO ≤ HI`.
fn parse_range(s: &str) -> Result<(f32, f32), String> {
    let (lo, hi) = s
        .split_once(',')
        .ok_or_else(|| format!("'{s}' is not a range LO,HI"))?;
    let parse = |v: &str| {
        v.trim()
            .parse::<f32>()
            .map_err(|_| format!("'{v}' is not a number"))
    };
    Ok((parse(lo)?, parse(hi)?))
}

fn parse_accuracy_k(s: &str) -> Result<wgpu_metric_learning::AccuracyK, String> {
    use wgpu_metric_learning::AccuracyK;
    match s {
        "all" => Ok(AccuracyK::All),
        "max_bin_count" => Ok(AccuracyK::MaxBinCount),
        n => n
            .parse::<usize>()
            .map(AccuracyK::Fixed)
            .map_err(|_| format!("'{s}' is not all, max_bin_count or a number")),
    }
}

/// Why a subcommand did not finish.
pub(crate) enum Failure {
    /// Bad input, or a library error: one line naming the file and the problem.
    Message(String),
    /// Ctrl-C: the operation stopped at a chunk boundary.
    Cancelled,
    /// A failure whose message was printed already (by a rank of an MPI job, before the job
    /// could end it): exit with status 1 and print nothing more.
    #[cfg(feature = "mpi")]
    Reported,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Failure::Message(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        Failure::Message(message.into())
    }
}

/// The exit status of a process stopped by SIGINT, by the shells' convention.
const INTERRUPTED: u8 = 130;

/// A token that Ctrl-C cancels: the running operation stops at its next chunk, releases what
/// it allocated and returns; a second Ctrl-C exits at once.
fn cancel_on_ctrl_c() -> CancelToken {
    let token = CancelToken::new();
    let on_signal = token.clone();
    let handler = ctrlc::set_handler(move || {
        if on_signal.is_cancelled() {
            std::process::exit(i32::from(INTERRUPTED));
        }
        on_signal.cancel();
    });
    if let Err(e) = handler {
        // Without the handler Ctrl-C still ends the process, only less politely.
        eprintln!("wml: warning: Ctrl-C will not stop cleanly: {e}");
    }
    token
}

fn main() -> ExitCode {
    // A panic would be a bug; still, the user gets one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("wml: internal error: {info}");
    }));
    let cli = Cli::parse();
    let hooks = hooks(cli.command.common());
    let done = match cli.command {
        Command::Triplets(a) => commands::triplets(&a, &hooks),
        Command::Mine(a) => commands::mine(&a, &hooks),
        #[cfg(feature = "mpi")]
        Command::Knn(a) if a.distributed.distributed => distributed::knn(&a, &hooks),
        Command::Knn(a) => commands::knn(&a, &hooks),
        #[cfg(feature = "mpi")]
        Command::Accuracy(a) if a.distributed.distributed => distributed::accuracy(&a, &hooks),
        Command::Accuracy(a) => commands::accuracy(&a, &hooks),
        Command::Loss(LossCommand::TripletMargin(a)) => losses::triplet_loss(&a, &hooks),
        Command::Loss(LossCommand::Ntxent(a)) => losses::ntxent(&a, &hooks),
        Command::Loss(LossCommand::Mnrl(a)) => losses::mnrl(&a, &hooks),
        Command::Loss(LossCommand::Contrastive(a)) => losses::contrastive(&a, &hooks),
        Command::Loss(LossCommand::MultiSimilarity(a)) => losses::multi_similarity(&a, &hooks),
        Command::Loss(LossCommand::Supcon(a)) => losses::supcon(&a, &hooks),
        Command::Loss(LossCommand::Circle(a)) => losses::circle(&a, &hooks),
        Command::Loss(LossCommand::Nca(a)) => losses::nca(&a, &hooks),
        Command::Loss(LossCommand::GeneralizedLifted(a)) => losses::generalized_lifted(&a, &hooks),
        Command::Loss(LossCommand::Margin(a)) => losses::margin(&a, &hooks),
        Command::Loss(LossCommand::FastAp(a)) => losses::fast_ap(&a, &hooks),
        Command::Loss(LossCommand::LiftedStructure(a)) => losses::lifted(&a, &hooks),
        Command::Loss(LossCommand::Histogram(a)) => losses::histogram(&a, &hooks),
        Command::Loss(LossCommand::TupletMargin(a)) => losses::tuplet(&a, &hooks),
        Command::Loss(LossCommand::IntraPairVariance(a)) => losses::intra_pair_variance(&a, &hooks),
        Command::Loss(LossCommand::RankedList(a)) => losses::ranked_list(&a, &hooks),
        Command::Loss(LossCommand::Tcm(a)) => losses::tcm(&a, &hooks),
        Command::Loss(LossCommand::Pnp(a)) => losses::pnp(&a, &hooks),
        Command::Loss(LossCommand::NPairs(a)) => losses::n_pairs(&a, &hooks),
        Command::Loss(LossCommand::Instance(a)) => losses::instance(&a, &hooks),
        Command::Loss(LossCommand::Angular(a)) => losses::angular(&a, &hooks),
        Command::Loss(LossCommand::Vicreg(a)) => losses::vicreg(&a, &hooks),
        Command::Loss(LossCommand::SnrContrastive(a)) => losses::snr_contrastive(&a, &hooks),
        Command::Loss(LossCommand::DynamicSoftMargin(a)) => losses::dynamic_soft_margin(&a, &hooks),
        Command::Loss(LossCommand::ArcFace(a)) => classifier::run("arcface", &a, &hooks),
        Command::Loss(LossCommand::SubCenterArcFace(a)) => {
            classifier::run("sub-center-arcface", &a, &hooks)
        }
        Command::Loss(LossCommand::CosFace(a)) => classifier::run("cosface", &a, &hooks),
        Command::Loss(LossCommand::LargeMarginSoftmax(a)) => {
            classifier::run("large-margin-softmax", &a, &hooks)
        }
        Command::Loss(LossCommand::SphereFace(a)) => classifier::run("sphereface", &a, &hooks),
        Command::Loss(LossCommand::NormalizedSoftmax(a)) => {
            classifier::run("normalized-softmax", &a, &hooks)
        }
        Command::Loss(LossCommand::ProxyNca(a)) => classifier::run("proxy-nca", &a, &hooks),
        Command::Loss(LossCommand::ProxyAnchor(a)) => classifier::run("proxy-anchor", &a, &hooks),
        Command::Loss(LossCommand::SoftTriple(a)) => classifier::run("soft-triple", &a, &hooks),
        Command::Tune(a) => commands::tune(&a),
        Command::Weights(WeightsCommand::Step(a)) => weights::step(&a),
        Command::Weights(WeightsCommand::Export(a)) => weights::export(&a),
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Message(message)) => {
            eprintln!("wml: {message}");
            ExitCode::FAILURE
        }
        #[cfg(feature = "mpi")]
        Err(Failure::Reported) => ExitCode::FAILURE,
        Err(Failure::Cancelled) => {
            eprintln!("wml: cancelled (Ctrl-C); no output was written");
            ExitCode::from(INTERRUPTED)
        }
    }
}

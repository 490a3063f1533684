//! How two embeddings are compared: a leaf module that every other one may import.

/// How two embeddings are compared, with PML's names and sign conventions.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{pairwise_distances, Context, Distance, DistanceConfig, PairwiseConfig};
/// let (q, r) = (ndarray::array![[3.0f32, 0.0]], ndarray::array![[0.0f32, 4.0]]);
/// let raw = |distance| PairwiseConfig {
///     distance: DistanceConfig { distance, normalize: false },
///     ..Default::default()
/// };
/// let ctx = Context::native_cpu(None);
/// let d = |distance| pairwise_distances(&ctx, &q, &r, &raw(distance)).map(|d| d.values[[0, 0]]);
/// assert_eq!(d(Distance::Euclidean)?, 5.0);
/// assert_eq!(d(Distance::SquaredEuclidean)?, 25.0);
/// assert_eq!(d(Distance::DotProduct)?, 0.0);
/// # Ok::<(), wgpu_metric_learning::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distance {
    /// `|q − r|₂` (PML `LpDistance()`); small = close.
    #[default]
    Euclidean,
    /// `|q − r|₂²` (PML `LpDistance(power=2)`, Faiss `IndexFlatL2`); small = close.
    SquaredEuclidean,
    /// `q·r / (|q| |r|)` (PML `CosineSimilarity()`); large = close. Always normalised.
    Cosine,
    /// `q·r` (PML `DotProductSimilarity()`, Faiss `IndexFlatIP`); large = close.
    DotProduct,
}

impl Distance {
    /// Whether large values mean close (PML's `is_inverted`): true for cosine and dot product.
    ///
    /// # Example
    /// ```
    /// assert!(wgpu_metric_learning::Distance::Cosine.is_similarity());
    /// ```
    pub fn is_similarity(self) -> bool {
        matches!(self, Distance::Cosine | Distance::DotProduct)
    }

    /// The shader's `metric` code.
    pub(crate) fn code(self) -> u32 {
        match self {
            Distance::Euclidean => 0,
            Distance::SquaredEuclidean => 1,
            Distance::Cosine => 2,
            Distance::DotProduct => 3,
        }
    }
}

/// Which distance, on normalised or raw embeddings.
///
/// # Example
/// ```
/// use wgpu_metric_learning::{Distance, DistanceConfig};
/// let faiss_l2 = DistanceConfig { distance: Distance::SquaredEuclidean, normalize: false };
/// assert_eq!(DistanceConfig::default().distance, Distance::Euclidean);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistanceConfig {
    /// The distance. Default: [`Distance::Euclidean`] (PML's default).
    pub distance: Distance,
    /// L2-normalise every embedding first (`x / max(|x|, 1e-12)`). Default `true`, as in PML,
    /// whose distances all normalise by default; `false` is Faiss's convention. Cosine
    /// always normalises.
    pub normalize: bool,
}

impl DistanceConfig {
    /// Whether embeddings are L2-normalised first: as configured, and always for cosine.
    pub(crate) fn normalizes(&self) -> bool {
        self.normalize || self.distance == Distance::Cosine
    }
}

impl Default for DistanceConfig {
    fn default() -> Self {
        Self {
            distance: Distance::Euclidean,
            normalize: true,
        }
    }
}

//! Reference of `shaders/triplet_lists.wgsl`.

/// For each anchor, its ascending positive references (same label, not its own slot) and its
/// ascending negative references (other label).
///
/// `self_slots[a]` is the reference that holds anchor `a` itself, or `u32::MAX` for none.
///
/// # Example
/// ```
/// use wgpu_metric_learning::reference::triplet_lists::triplet_lists;
/// let lists = triplet_lists(&[0, 1], &[0, 1, 0], &[0, u32::MAX]);
/// assert_eq!(lists[0], (vec![2], vec![1]));
/// assert_eq!(lists[1], (vec![1], vec![0, 2]));
/// ```
pub fn triplet_lists(
    anchor_labels: &[u32],
    ref_labels: &[u32],
    self_slots: &[u32],
) -> Vec<(Vec<u32>, Vec<u32>)> {
    anchor_labels
        .iter()
        .zip(self_slots)
        .map(|(&label, &me)| {
            let mut positives = Vec::new();
            let mut negatives = Vec::new();
            for (r, &other) in ref_labels.iter().enumerate() {
                let r = r as u32;
                if other == label && r != me {
                    positives.push(r);
                }
                if other != label {
                    negatives.push(r);
                }
            }
            (positives, negatives)
        })
        .collect()
}

//! Attention over disjoint runs of keys, merged exactly (flash-decoding): each run leaves, per
//! query head, its largest score `m`, its denominator `s = Σ e^(score − m)` and its unnormalised
//! output `o = Σ e^(score − m) v`, laid out `[m, s, o…]`; the runs of one head are merged by
//! rescaling each to the common maximum. A run in which the head saw no key leaves `m = −∞`.

/// Values before a part's output: its maximum and its denominator.
pub(super) const HEADER: usize = 2;

/// `Σ_c e^(m_c − M) o_c / Σ_c e^(m_c − M) s_c` over the `parts` that saw a key, `M` the largest
/// `m_c`, into `target` (the head size); zeros when no part saw one, as a masked softmax gives.
pub(super) fn merge_parts<'a>(parts: impl Iterator<Item = &'a [f32]> + Clone, target: &mut [f32]) {
    target.fill(0.0);
    let seen = parts.filter(|part| part[0] > f32::NEG_INFINITY);
    let max = seen
        .clone()
        .map(|part| part[0])
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return;
    }
    let mut denominator = 0f32;
    for part in seen {
        let scale = (part[0] - max).exp();
        denominator += scale * part[1];
        for (t, o) in target.iter_mut().zip(&part[HEADER..]) {
            *t += scale * o;
        }
    }
    let inverse = denominator.recip();
    target.iter_mut().for_each(|t| *t *= inverse);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_merge_to_the_softmax_of_their_union() {
        // Scores [1, 3] with values [10, 20] in one part, [2] with [30] in another.
        let e = |x: f32| x.exp();
        let part_a = [3.0, e(1.0 - 3.0) + 1.0, e(1.0 - 3.0) * 10.0 + 20.0];
        let part_b = [2.0, 1.0, 30.0];
        let unseen = [f32::NEG_INFINITY, 0.0, 0.0];
        let mut target = [0f32];
        merge_parts([&part_a[..], &unseen, &part_b].into_iter(), &mut target);
        let total = e(1.0) + e(3.0) + e(2.0);
        let expected = (e(1.0) * 10.0 + e(3.0) * 20.0 + e(2.0) * 30.0) / total;
        assert!(
            (target[0] - expected).abs() < 1e-5,
            "{} vs {expected}",
            target[0]
        );
    }

    #[test]
    fn nothing_seen_is_zero() {
        let unseen = [f32::NEG_INFINITY, 0.0, 0.0, 0.0];
        let mut target = [7f32, 7.0];
        merge_parts([&unseen[..], &unseen].into_iter(), &mut target);
        assert_eq!(target, [0.0, 0.0]);
    }
}

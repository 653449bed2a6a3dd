"""FID and KID arithmetic on small hand-made features, against independent computations (scipy's sqrtm,
an explicit unbiased MMD^2): the Frechet distance of non-diagonal covariances, the sample count needed for a
full-rank covariance (more samples than dimensions), the equal disjoint splits with the remainder left out,
and KID's subsets on sets of unequal size."""

import numpy as np
import pytest
from scipy import linalg

from mediagen.eval.fid import (check_enough_samples, feature_stats, fid_from_features, frechet_distance,
                               kernel_distance, split_fids)


def scipy_fid(a, b):
    mu1, mu2 = a.mean(0), b.mean(0)
    s1, s2 = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = linalg.sqrtm(s1 @ s2).real
    return float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean))


def test_frechet_distance_of_correlated_features_matches_scipy():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(400, 5)) @ rng.normal(size=(5, 5))
    b = rng.normal(size=(300, 5)) @ rng.normal(size=(5, 5)) + 0.7
    mu_b, sig_b = feature_stats(b)
    assert fid_from_features(a, mu_b, sig_b) == pytest.approx(scipy_fid(a, b), rel=1e-8)
    mu_a, sig_a = feature_stats(a)
    assert frechet_distance(mu_a, sig_a, mu_b, sig_b) == pytest.approx(frechet_distance(mu_b, sig_b, mu_a, sig_a),
                                                                       rel=1e-8)


def test_as_many_samples_as_dimensions_is_too_few():
    """n samples give a covariance of rank at most n - 1: n = dim is singular, dim + 1 is the least."""
    with pytest.raises(ValueError, match="got 6 samples for 6-d features"):
        check_enough_samples(6, 6)
    check_enough_samples(7, 6)
    feats = np.random.default_rng(1).normal(size=(6, 6))
    with pytest.raises(ValueError, match="FID needs more samples"):
        fid_from_features(feats, np.zeros(6), np.eye(6))
    assert np.isfinite(fid_from_features(np.vstack([feats, feats[:1] + 1]), np.zeros(6), np.eye(6)))


def test_splits_are_equal_and_disjoint_and_leave_the_remainder_out():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(20, 2)) * np.arange(1, 21)[:, None]     # every sample differs in scale
    ref = rng.normal(size=(50, 2))
    mu, sig = feature_stats(ref)
    got = split_fids(feats, mu, sig, 3)                              # 20 // 3 = 6 each, 2 left out
    want = [scipy_fid(feats[i * 6:(i + 1) * 6], ref) for i in range(3)]
    assert got == pytest.approx(want, rel=1e-8)


def unbiased_mmd2(x, y):
    """The unbiased MMD^2 of the full sets with k(a, b) = (a.b / d + 1)^3, written out term by term."""
    d = x.shape[1]

    def k(a, b):
        return (a @ b / d + 1.0) ** 3

    n, m = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i in range(n) for j in range(n) if i != j) / (n * (n - 1))
    yy = sum(k(y[i], y[j]) for i in range(m) for j in range(m) if i != j) / (m * (m - 1))
    xy = sum(k(x[i], y[j]) for i in range(n) for j in range(m)) / (n * m)
    return xx + yy - 2 * xy


@pytest.mark.parametrize("sizes", [(12, 12), (9, 14), (14, 9)])
def test_kid_is_the_unbiased_mmd_of_its_subsets(sizes):
    """With subsets as large as the smaller set, that set is used whole and the other is sampled without
    replacement; the unbiased estimate of every subset averages to the full sets' unbiased MMD^2 (equal
    sizes: exactly, every subset is the whole set)."""
    rng = np.random.default_rng(3)
    f1 = rng.normal(size=(sizes[0], 3))
    f2 = rng.normal(size=(sizes[1], 3)) * 1.5 + 0.5
    want = unbiased_mmd2(f1, f2)
    if sizes[0] == sizes[1]:
        assert kernel_distance(f1, f2, num_subsets=3) == pytest.approx(want, rel=1e-10)
    else:
        assert kernel_distance(f1, f2, num_subsets=4000, seed=1) == pytest.approx(want, rel=0.03)
    # subsets smaller than both sets: the average of the subset estimates has the same expectation
    assert kernel_distance(f1, f2, num_subsets=6000, max_subset_size=6, seed=2) == pytest.approx(want, rel=0.06)
    # a set against itself: the cross term keeps the pairs of a sample with itself, so the estimate is below 0
    assert kernel_distance(f1, f1, num_subsets=3) == pytest.approx(unbiased_mmd2(f1, f1), rel=1e-10)
    assert unbiased_mmd2(f1, f1) < 0

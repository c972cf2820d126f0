import random

import pytest

from pipeprof.core.stats import Stat, bucket_bounds, bucket_of


def test_every_value_falls_in_its_bucket():
    for v in [0, 1, 31, 32, 33, 47, 48, 63, 64, 1000, 123_456_789, 2**40 + 5]:
        low, high = bucket_bounds(bucket_of(v))
        assert low <= v < high


def test_percentiles_within_three_percent_and_exact_moments():
    rng = random.Random(1)
    values = [rng.randint(1_000, 50_000_000) for _ in range(20_000)]
    s = Stat.of(values)
    ordered = sorted(values)
    for q in (50, 95, 99):
        exact = ordered[max(0, int(q / 100 * len(values)) - 1)]
        assert s.percentile_ns(q) == pytest.approx(exact, rel=0.03)
    assert s.total_ns == sum(values) and s.min_ns == min(values) and s.max_ns == max(values)
    assert s.mean_ns == pytest.approx(sum(values) / len(values))


@pytest.mark.parametrize("n", [1, 5, 64])  # up to 64: the plain-Python path, not NumPy's
def test_few_at_once_equal_one_by_one(n):
    rng = random.Random(n)
    durs = [rng.randint(-50, 10**9) for _ in range(n)]
    for items in (None, [rng.choice([1, 3, 32]) for _ in durs]):
        a = Stat.of_many(durs, items)
        b = Stat()
        for d, k in zip(durs, items or [1] * n):
            b.add(d, k)
        assert a.to_dict() == b.to_dict() and a.sum_sq == b.sum_sq


def test_vectorised_equals_one_by_one_and_round_trips():
    rng = random.Random(2)
    durs = [rng.randint(0, 10**8) for _ in range(3000)]
    items = [rng.choice([1, 1, 8]) for _ in durs]
    a = Stat.of_many(durs, items)
    b = Stat()
    for d, n in zip(durs, items):
        b.add(d, n)
    assert (a.count, a.total_ns, a.min_ns, a.max_ns, a.hist) == (
        b.count,
        b.total_ns,
        b.min_ns,
        b.max_ns,
        b.hist,
    )
    assert a.sum_sq == pytest.approx(b.sum_sq)
    c = Stat.from_dict(a.to_dict())
    assert c.to_dict() == a.to_dict()
    a.merge(c)
    assert a.count == 2 * c.count and a.total_ns == 2 * c.total_ns
